"""What every engine offers, and the per-party input layout both engines read.

Party i's inputs live in its own directory (``party_dirs[i]``) and an engine gives
party i's process that directory only:

- ``data.shr``   ShareBundle kind "data",   shape (m, p): encoded feature values
- ``labels.shr`` ShareBundle kind "labels", shape (m, n-1): one-hot labels (0/1)
- ``mask.shr``   ShareBundle kind "mask",   shape (k + m*k, 2): the recipient's mask words

Two ways to run: :meth:`Engine.run_step2a` launches every party on this machine (the
embedded default); :meth:`Engine.run_party` launches one party only, as a party
daemon does, with the peers' MPC addresses and the deployment's TLS material in a
:class:`PartyRunSpec`. Both build on the same per-party set-up and launch steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from ppfs.errors import ParameterError
from ppfs.sharing import ShareBundle
from ppfs.step2a import Security, Step2AShape

PARTY_NAMES = ("Alice", "Bob", "Carol", "Dave")
# A job's session tag (ppfs.contract.session_tag, SESSION_TAG_BITS = 252) as the engines
# input it: SESSION_WORDS words of SESSION_WORD_BITS bits, each a value both engines'
# arithmetic holds (MP-SPDZ's 64-bit ring, MPyC's secure integers); step2a.mpc reads as
# many words
SESSION_WORDS, SESSION_WORD_BITS = 4, 63


def session_words(tag: int) -> list[int]:
    """The words of a session tag, the lowest first; ParameterError for a tag that does
    not fit them."""
    if not 0 <= tag < 1 << (SESSION_WORDS * SESSION_WORD_BITS):
        raise ParameterError(f"the session tag must be a "
                             f"{SESSION_WORDS * SESSION_WORD_BITS}-bit value")
    mask = (1 << SESSION_WORD_BITS) - 1
    return [(tag >> (SESSION_WORD_BITS * w)) & mask for w in range(SESSION_WORDS)]
INPUT_FILES = ("data.shr", "labels.shr", "mask.shr")

Progress = Callable[[str], None]


# The umask an engine's processes run with: what they write (MP-SPDZ's MAC keys and
# output, an MPyC worker's opened words and status) is for this user alone.
PRIVATE_UMASK = 0o077


def private_dir(path: Path) -> Path:
    """``path`` as a directory for this user alone (0700), made if missing (its missing
    parents too, each 0700) and narrowed if it was there: a party's directories hold
    share components, MAC keys, its TLS key and opened words, whatever the umask and
    however open the folder it is given is."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)
        d.chmod(0o700)
    path.chmod(0o700)
    return path


def private_opener(path: str, flags: int) -> int:
    """``open(..., opener=private_opener)``: a file it creates is 0600 from the start."""
    return os.open(path, flags, 0o600)


def make_private(root: Path) -> None:
    """Take every group and other permission off ``root`` and what is under it (links
    are not followed: they carry no access of their own)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (".", *dirnames, *filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


class ProgressNote(str):
    """A progress message that also says how far the secure computation is.

    A ``str``, so every :data:`Progress` consumer takes it as it takes any message;
    one that shows a percentage reads ``fraction`` (0 to 1, of the secure computation
    alone: launching the parties to the last one's exit)."""

    fraction: float

    def __new__(cls, text: str, fraction: float) -> ProgressNote:
        note = super().__new__(cls, text)
        note.fraction = min(1.0, max(0.0, fraction))
        return note


_T = TypeVar("_T")


async def to_thread_to_the_end(func: Callable[..., _T], *args: Any) -> _T:
    """``await asyncio.to_thread(func, *args)``, except that a cancelled caller waits
    for the thread to finish before its cancellation goes on.

    A thread cannot be stopped: one writing a party's share copy would otherwise go on
    writing after the caller's cleanup had removed it, and leave the copy behind."""
    fut = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({fut})
        if not fut.cancelled():
            fut.exception()  # the caller sees its cancellation, not the thread's error
        raise


Address = tuple[str, int]
# (party, every party's MPC address) -> the addresses that party dials (own one unchanged);
# an engine's ``peer_view`` option, for embedded runs (e.g. through delaying relays)
PeerView = Callable[[int, tuple[Address, ...]], tuple[Address, ...]]


@dataclass(frozen=True)
class Step2AInputs:
    shape: Step2AShape
    security: Security
    party_dirs: tuple[Path, ...]


@dataclass
class PartyStats:
    party: str
    exit_code: int | None
    seconds: float
    bytes_sent: int
    rounds: int = 0  # communication rounds the engine reports for this party (0: not reported)
    # the party process's peak resident memory in bytes (None: not measured by this engine)
    peak_rss_bytes: int | None = None


@dataclass
class EngineRun:
    """What an engine hands back: only masked words, plus run statistics."""

    engine: str
    opened: np.ndarray  # uint64, shape.outputs masked words
    seconds: float  # from launching the parties until the last one exited
    bytes_sent: int
    parties: list[PartyStats] = field(default_factory=list)
    program_hash: str | None = None
    compile_seconds: float = 0.0  # compiling (or finding the cached program), not in seconds
    # the parties' keys, working directories and input files, before launching (not in
    # seconds)
    setup_seconds: float = 0.0
    rounds: int = 0  # the most communication rounds any party reports (0 if unknown)


@dataclass(frozen=True)
class PartyTls:
    """One party's MPC TLS material, all issued by the deployment CA.

    ``key`` stays in the party's state directory (mode 0600); the engine links or
    copies it into the run's working directory only. The certificate's subject must
    be :meth:`Engine.mpc_subject` for this party (MP-SPDZ and MPyC check peers by name).
    """

    key: Path
    cert: Path
    ca_cert: Path


@dataclass(frozen=True)
class PartyRunSpec:
    """Everything one party needs to run its share of Step 2A."""

    security: Security
    shape: Step2AShape
    party: int
    input_dir: Path  # data.shr, labels.shr, mask.shr of this party
    workdir: Path  # this party's working directory for this run (created, emptied)
    peers: tuple[tuple[str, int], ...]  # MPC (host, port) per party, identical on all
    tls: PartyTls
    program_hash: str | None = None  # refuse to run when the own program differs
    timeout: float | None = None  # None: the engine's default
    # stop the run once this party neither computed nor printed for this many seconds
    # (a peer stopped answering); None: the engine's default
    stall_timeout: float | None = None
    bind_host: str | None = None  # listen on this address only (None: every interface)
    # 252-bit tag of the job (ppfs.contract.session_tag): every party inputs it before
    # any data, as SESSION_WORDS words (session_words), and the run stops unless all tags
    # agree in every word. None: an embedded run (tag 0).
    session_tag: int | None = None
    # Where this party dials each peer, when that differs from ``peers`` (a relay or a
    # NAT in between); its own entry must be ``peers[party]``. None: dial ``peers``.
    dial: tuple[tuple[str, int], ...] | None = None
    # This party's data, labels and mask bundles in memory, as a party daemon assembles
    # them for the job; None: read them from ``input_dir``. The engine takes them once
    # (:meth:`take_bundles`), so that nothing holds them while the run lasts; one that
    # reads its inputs in another process writes them to ``input_dir`` instead
    # (:meth:`write_input_files`).
    bundles: list[ShareBundle] | None = None

    @property
    def name(self) -> str:
        return PARTY_NAMES[self.party]

    def take_bundles(self) -> list[ShareBundle] | None:
        """The bundles handed over in memory (None if there are none), emptying
        :attr:`bundles`: a second call finds none."""
        if self.bundles is None:
            return None
        taken = list(self.bundles)
        self.bundles.clear()
        return taken

    def write_input_files(self) -> None:
        """Save the bundles handed over in memory (if any) to ``input_dir`` as
        data.shr, labels.shr and mask.shr, not synced to disk: they live only as long as
        the run."""
        bundles = self.take_bundles()
        if bundles is None:
            return
        private_dir(self.input_dir)
        for b in bundles:
            b.save(self.input_dir / f"{b.kind}.shr", durable=False)

    def dial_addresses(self) -> tuple[tuple[str, int], ...]:
        """The addresses this party dials: ``dial`` when given, else ``peers``. The party
        listens at its own entry, so ``dial`` must keep that one as it is in ``peers``."""
        if self.dial is None:
            return self.peers
        if len(self.dial) != len(self.peers) or self.dial[self.party] != self.peers[self.party]:
            raise ParameterError(
                "the dial addresses must list every party and this party's own address"
            )
        return self.dial


@dataclass
class PartyRunResult:
    """One party's view of a finished run: the opened masked words and its statistics."""

    party: int
    opened: np.ndarray  # uint64, shape.outputs masked words
    seconds: float
    bytes_sent: int
    exit_code: int
    program_hash: str
    peak_rss_bytes: int | None = None  # the party process's peak resident memory, if measured


class Engine(Protocol):
    name: str

    def unavailable_reason(self) -> str | None:
        """None when usable here, else a one-line reason."""

    def supports(self, security: Security) -> bool: ...

    async def run_step2a(
        self, inputs: Step2AInputs, workdir: Path, progress: Progress | None = None
    ) -> EngineRun: ...

    async def prepare(self, shape: Step2AShape, security: Security) -> str:
        """Compile (or describe) the program for this shape; returns its SHA-256."""
        ...

    def mpc_subject(self, party: int) -> tuple[str, bool]:
        """(common name, with DNS SAN) the party's MPC certificate must carry."""
        ...

    async def run_party(
        self, spec: PartyRunSpec, progress: Progress | None = None
    ) -> PartyRunResult:
        """Run this party only. Raises EngineError naming this party on failure;
        cancelling the call kills the party's engine process."""
        ...
