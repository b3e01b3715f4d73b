"""Step 2A on MP-SPDZ: one party process per server on this machine.

MP-SPDZ is used as an external tool found at ``home`` (``MPSPDZ_HOME``, else
``/opt/mp-spdz``); nothing of it is copied into this project. Per run:

1. The program ``mpspdz_programs/step2a.mpc`` is compiled once per (protocol, shape)
   into a cache outside the MP-SPDZ home and outside the repository
   (``$PPFS_MPSPDZ_CACHE``, else ``$XDG_CACHE_HOME/ppfs/mpspdz``, else
   ``~/.cache/ppfs/mpspdz``), keyed by a hash of the program source, the compile
   arguments, the protocol and the MP-SPDZ compiler sources. The SHA-256 of the
   bytecode and schedule is the run's ``program_hash``; every party's working
   directory is checked to hold exactly that program before anything starts.
2. Each party gets its own working directory (``workdir/mpspdz/P<i>`` embedded,
   the job's directory in a party daemon) with ``Player-Data/`` (a link to its own
   TLS key; its certificate, named ``P<i>`` and issued by the deployment CA — in
   embedded mode a fresh per-run CA that is then discarded; the CA certificate,
   hashed for OpenSSL's lookup, is the trust anchor for the peers), ``Programs``
   linked to the compiled program, its binary input file and a ``HOSTS`` file of
   every party's MPC address.
3. Party i's shares go in as its pairs (c_i, c_{i-1}) in the 3PC settings (the
   persistence file in passive 3PC, the memory file in active 3PC) and as its items
   of the input plan in active 4PC (:func:`write_party_input`); its input file holds
   the session tag first. Active 3PC runs only on a build whose MAC check rejects a
   forged MAC (:mod:`ppfs.engines.mpspdz_check`). The program opens only (result +
   recipient's mask), which every party writes to ``Player-Data/Binary-Output-P<i>-0``.

:meth:`MpSpdzEngine.run_party` runs one party (a party daemon's call);
:meth:`MpSpdzEngine.run_step2a` sets up and launches every party with the same
per-party steps and supervises them together (first failure stops all, the
culprit is named). Engine processes are started through
:mod:`ppfs.engines.pdeathsig`, so they die with the process that launched them; that
launcher also reports each one's exact peak resident memory (``wait4``), kept as the
party's ``peak_rss_bytes``.

Engine output is kept in capped files in each party's directory and never copied
into an error message or a log: errors name the party, the exit code and a fixed
reason. ``bytes_sent`` is the sum of the per-party "Data sent" figures MP-SPDZ
reports with ``-v`` (MB with six significant digits, so approximate); each party's
``rounds`` is the round count MP-SPDZ reports beside it.

A party binds the port of its own line in ``HOSTS`` and dials the others at theirs,
so party i's ``HOSTS`` may list other addresses for its peers than the peers listen
at (:attr:`PartyRunSpec.dial`; in embedded runs, the engine's ``peer_view``): the
latency benchmark puts a delaying relay in front of every peer this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from cryptography import x509

from ppfs import step2b
from ppfs.durable import free_ports
from ppfs.engines import pdeathsig
from ppfs.engines.base import (
    INPUT_FILES,
    PARTY_NAMES,
    PRIVATE_UMASK,
    EngineRun,
    PartyRunResult,
    PartyRunSpec,
    PartyStats,
    PartyTls,
    PeerView,
    Progress,
    ProgressNote,
    Step2AInputs,
    make_private,
    private_dir,
    private_opener,
    session_words,
    to_thread_to_the_end,
)
from ppfs.engines.mpspdz_check import (
    check_spdzwise,
    failed_a_mac_check,
    memory_file,
    party_env,
    write_spdzwise_memory,
)
from ppfs.engines.mpspdz_release import cpu_bin_dirs
from ppfs.engines.pdeathsig import read_peak_rss
from ppfs.engines.stall import (
    DEFAULT_STALL_SECONDS,
    SAMPLE_SECONDS,
    StallWatch,
    proc_available,
    sample_tree,
)
from ppfs.errors import (
    EngineError,
    IntegrityError,
    ParameterError,
    PeerLostError,
    RangeAbortError,
    SessionMismatchError,
    ShareFormatError,
    StalledError,
    TimedOutError,
)
from ppfs.pki import CertificateAuthority, hash_link, party_key_and_csr, subject_hash, write_cert
from ppfs.scoring import Scorer
from ppfs.sharing import ShareBundle
from ppfs.step2a import MASK_WORD_BITS, Security, Step2AShape, input_plan

PROGRAM = "step2a"
# -M: keep memory accesses in program order. The compiler tracks dependencies of
# long-vector and indirect (gather) memory accesses only partially and otherwise
# may reorder them within a basic block, which silently corrupts results.
COMPILE_FLAGS = ("-M",)
# Bumped whenever what a cache entry holds or how its hash is computed changes, so an
# old entry is never mistaken for a new one.
CACHE_LAYOUT = b"ppfs-mpspdz-cache-3"
INTEGRITY_MARKER = b"PPFS-INTEGRITY-FAILURE"
SESSION_MARKER = b"PPFS-SESSION-MISMATCH"
# printed by the program once its inputs are verified, right before anything that
# depends on the data is opened
OPENING_MARKER = b"PPFS-INPUTS-VERIFIED"
# Step 2B's range checks (ppfs.step2b): the program prints one of these and stops
RANGE_MARKERS = {b"PPFS-RANGE-RATIO": "ratio", b"PPFS-RANGE-WEIGHTS": "weights"}
LOG_CAP = 256 * 1024  # bytes of each party's stdout/stderr kept on disk
# the program's progress lines: PPFS-PROGRESS <stage> <done> <total> (ProgressPlan)
PROGRESS_PREFIX = b"PPFS-PROGRESS "
DEFAULT_TIMEOUT = 4 * 3600.0
GRACE_SECONDS = 3.0  # how long the others may take to stop on their own after a failure


@dataclass(frozen=True)
class Protocol:
    binary: str
    compile_flag: str  # compile.py -E <flag>


PROTOCOLS: dict[Security, Protocol] = {
    Security.PASSIVE_3PC: Protocol("replicated-ring-party.x", "ring"),
    Security.ACTIVE_3PC: Protocol("sy-rep-ring-party.x", "sy-rep-ring"),
    Security.ACTIVE_4PC: Protocol("rep4-ring-party.x", "rep4-ring"),
}

# The active protocols make their correlated randomness (triples, bits) in batches,
# each batch a few rounds; MP-SPDZ's default of 1,000 made Step 2A's comparisons over
# m*p entries wait for thousands of them. One batch per up to m*p items (capped,
# identical on every party as it depends on the public shape only) keeps that to a
# handful. The checks' bucket size, and with it their security, is MP-SPDZ's default.
MIN_BATCH, MAX_BATCH = 1000, 100_000


def preprocessing_batch(shape: Step2AShape, security: Security) -> list[str]:
    """The party binary's batch-size option for this job (none for passive 3PC)."""
    if security is Security.PASSIVE_3PC:
        return []
    return ["-b", str(min(MAX_BATCH, max(MIN_BATCH, shape.m * shape.p)))]


_SENT_RE = re.compile(rb"^Data sent = ([0-9.eE+-]+) MB", re.MULTILINE)
_ROUNDS_RE = re.compile(rb"^Data sent = [0-9.eE+-]+ MB in ~([0-9]+) rounds", re.MULTILINE)
_GLOBAL_RE = re.compile(rb"^Global data sent = ([0-9.eE+-]+) MB", re.MULTILINE)



def default_cache_dir() -> Path:
    env = os.environ.get("PPFS_MPSPDZ_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ppfs" / "mpspdz"


def program_source() -> bytes:
    ref = resources.files("ppfs.engines").joinpath("mpspdz_programs").joinpath(f"{PROGRAM}.mpc")
    return ref.read_bytes()


def scoring_source() -> bytes:
    """ppfs/scoring.py, which the program imports at compile time: part of the cache key."""
    return resources.files("ppfs").joinpath("scoring.py").read_bytes()


def compile_args(shape: Step2AShape, security: Security) -> list[str]:
    """Compile-time arguments: the security setting, the shape and its bit lengths."""
    if security not in PROTOCOLS:
        raise ParameterError(f"MP-SPDZ does not run {security.value}")
    return [
        security.value,
        *shape.program_args()[:5],
        str(shape.split_bits),
        str(shape.score_frac_bits),
        str(shape.int_steps),
        str(shape.div_int_bits),
        str(shape.div_frac_bits),
        str(shape.rank_bits),
        str(shape.threshold_steps),
        str(shape.threshold_bits),
        *shape.train_args(),  # Step 2B (ppfs.step2b), only when D' is withheld or trained
        # the scorer, last and only when not MS-GINI (MS-GINI programs keep their names)
        *([shape.scorer.value] if shape.scorer is not Scorer.MS_GINI else []),
    ]


def program_name(shape: Step2AShape, security: Security) -> str:
    return "-".join([PROGRAM, *compile_args(shape, security)])


def compile_command(home: Path, source: Path, shape: Step2AShape, security: Security,
                    *, verbose: bool = False) -> list[str]:
    """compile.py's argv for the program at ``source`` (relative to the directory it
    runs in); ``verbose`` adds the compiler's report (-v) of what each tape needs."""
    return [sys.executable, str(home / "compile.py"), *(["-v"] if verbose else []),
            "-E", PROTOCOLS[security].compile_flag, *COMPILE_FLAGS, str(source),
            *compile_args(shape, security)]


def matrix_shapes(shape: Step2AShape) -> dict[str, tuple[int, int]]:
    return {
        "data": (shape.m, shape.p),
        "labels": (shape.m, shape.n_classes - 1),
        "mask": (shape.outputs, 2),
    }


# Passive 3PC reads the parties' shares as they are: party i's components (i, i-1) are
# exactly its replicated share (a_i, a_{i-1}) of MP-SPDZ's Rep3, so they go into the
# persistence file the program reads (no input protocol, no rounds). Active 3PC finds
# the same pairs in MP-SPDZ's memory file as the replicated part of its SPDZ-wise
# shares (MEMORY_INPUT: the persistence file's signature would need the MAC key, which
# exists only once the run starts); the program computes their MACs and the SPDZ-wise
# check verifies them, and the two holders of each component compare its SHA-256
# digest in the program. Active 4PC inputs them through the input protocol, with
# redundancy (ppfs.step2a.input_plan), so that checks opened before anything else
# catch a party that inputs something other than what it holds.
PERSISTED = frozenset({Security.PASSIVE_3PC})
MEMORY_INPUT = frozenset({Security.ACTIVE_3PC})
DIGEST_WORDS = 4  # step2a.mpc's: a component's SHA-256 as four 64-bit words
# file signature of MP-SPDZ's Rep3 shares over Z_2^64: length-prefixed type string,
# then the bit length (Tools/Buffer.h file_signature)
_REP3_SIGNATURE = b"replicated Z2^64"
REP3_HEADER = (
    (len(_REP3_SIGNATURE) + 4).to_bytes(8, "little") + _REP3_SIGNATURE
    + (64).to_bytes(4, "little")
)
_WRITE_ENTRIES = 1 << 22  # entries per write when interleaving a share's two components
# entries per input chunk: step2a.mpc's CHUNK (its inputs go this many at a time)
INPUT_CHUNK = 1 << 17


def persistence_file(workdir: Path, party: int) -> Path:
    return workdir / "Persistence" / f"Transactions-P{party}.data"


def _checked_bundles(
    security: Security, shape: Step2AShape, party: int, party_dir: Path,
    given: Sequence[ShareBundle] | None = None,
) -> list[ShareBundle]:
    """The party's data, labels and mask bundles (``given``, else loaded from
    ``party_dir``), checked against the job's shape."""
    expected = matrix_shapes(shape)
    if given is not None and len(given) != len(INPUT_FILES):
        raise ShareFormatError(f"{PARTY_NAMES[party]} needs data, labels and mask bundles")
    dataset_id: str | None = None
    bundles = []
    for n, (kind, fname) in enumerate(zip(("data", "labels", "mask"), INPUT_FILES,
                                          strict=True)):
        bundle = ShareBundle.load(party_dir / fname) if given is None else given[n]
        if bundle.kind != kind or bundle.party != party or bundle.scheme != security.scheme:
            raise ShareFormatError(
                f"{PARTY_NAMES[party]}'s {fname} is not its {kind} share for {security.value}"
            )
        if bundle.shape != expected[kind]:
            raise ShareFormatError(
                f"{PARTY_NAMES[party]}'s {fname} has shape {bundle.shape}, "
                f"expected {expected[kind]}"
            )
        if kind == "data":
            dataset_id = bundle.dataset_id
        elif kind == "labels" and bundle.dataset_id != dataset_id:
            raise ShareFormatError(f"{PARTY_NAMES[party]}'s {fname} belongs to another data set")
        bundles.append(bundle)
    return bundles


def engine_components(bundle: ShareBundle) -> dict[int, np.ndarray]:
    """The components a party gives MP-SPDZ for one bundle, flat, as ``<u8`` words.

    Data and labels as they are. The mask's two words per output are folded into
    the one mask the program adds, w0 + 2^60 w1 mod 2^64 (ppfs.step2a.mask_values),
    component by component: the fold is linear, so the folded components are a
    sharing of the folded mask, and both holders of a component fold it alike. The
    program then reads one value per output instead of two."""
    comps = {j: np.ascontiguousarray(c, dtype="<u8") for j, c in bundle.components.items()}
    if bundle.kind != "mask":
        return {j: c.reshape(-1) for j, c in comps.items()}
    shift = np.uint64(MASK_WORD_BITS)
    return {j: c[:, 0] + (c[:, 1] << shift) for j, c in comps.items()}  # wraps mod 2^64


Given = list[tuple[str, dict[int, np.ndarray]]]  # (kind, engine_components) per bundle


def component_digest(bundles: Sequence[ShareBundle], component: int) -> list[int]:
    """SHA-256 of one share component as the party gives it to MP-SPDZ
    (:func:`engine_components`) over the data, labels and mask bundles, as
    :data:`DIGEST_WORDS` little-endian 64-bit words. Both holders of the component
    compute it from their copies; the program opens the difference of the two."""
    return _digest([(b.kind, engine_components(b)) for b in bundles], component)


def _digest(given: Given, component: int) -> list[int]:
    h = hashlib.sha256(b"ppfs share component v2\0" + component.to_bytes(4, "little"))
    for kind, comps in given:
        words = comps[component]
        h.update(kind.encode() + b"\0" + words.size.to_bytes(8, "little"))
        h.update(words.data)
    raw = h.digest()
    return [int.from_bytes(raw[8 * w:8 * w + 8], "little") for w in range(DIGEST_WORDS)]


def write_party_input(
    security: Security, shape: Step2AShape, party: int, party_dir: Path, out: Path,
    session_tag: int = 0, persistence: Path | None = None, memory: Path | None = None,
    bundles: Sequence[ShareBundle] | None = None,
) -> None:
    """Write party ``party``'s MP-SPDZ input from its share bundles (``bundles`` in
    memory, else those in ``party_dir``).

    The input file ``out`` starts with the job's session tag (its
    :data:`~ppfs.engines.base.SESSION_WORDS` words, the lowest first). In active 4PC
    it then holds, for data, labels and mask in turn (as :func:`engine_components`
    gives them: the mask folded to one word per output), the party's items of
    :func:`ppfs.step2a.input_plan` (each the sum of some of its components mod 2^64),
    as little-endian 64-bit words of the row-major matrix, :data:`INPUT_CHUNK` entries
    at a time: the first chunk of each of its items in plan order, then the second
    chunk of each, and so on, exactly the order in which ``step2a.mpc`` reads them.
    In passive 3PC (:data:`PERSISTED`) the shares go to ``persistence`` instead, as
    MP-SPDZ's Rep3 shares (a_i, a_{i-1}) of data, labels and mask in turn, after its
    file signature. In active 3PC (:data:`MEMORY_INPUT`) the same pairs go to the
    memory file ``memory`` (:func:`ppfs.engines.mpspdz_check.write_spdzwise_memory`)
    and the input file holds, after the tag, the digests (:func:`component_digest`)
    of the party's own component c_i and of c_{i-1}.
    """
    bundles = _checked_bundles(security, shape, party, party_dir, bundles)
    given: Given = [(b.kind, engine_components(b)) for b in bundles]
    out.parent.mkdir(parents=True, exist_ok=True)
    tag_words = session_words(int(session_tag))  # ParameterError unless it fits
    with open(out, "wb") as fh:
        fh.write(b"".join(w.to_bytes(8, "little") for w in tag_words))
        own, prev = party, (party - 1) % security.parties
        if security in MEMORY_INPUT:
            for j in (own, prev):
                fh.write(b"".join(w.to_bytes(8, "little") for w in _digest(given, j)))
        elif security not in PERSISTED:
            items = input_plan(security).party_items(party)
            for _, comps in given:
                size = next(iter(comps.values())).size
                for start in range(0, size, INPUT_CHUNK):
                    stop = min(size, start + INPUT_CHUNK)
                    for item in items:
                        words = comps[item.components[0]][start:stop].astype("<u8")
                        for j in item.components[1:]:
                            words += comps[j][start:stop]     # wraps mod 2^64
                        fh.write(words.data)
            return
    if security in MEMORY_INPUT:
        if memory is None:
            raise ParameterError(f"{security.value} needs the memory file's path")
        memory.parent.mkdir(parents=True, exist_ok=True)
        pairs = [(comps[own], comps[prev]) for _, comps in given]
        write_spdzwise_memory(memory, sum(a.size for a, _ in pairs), pairs)
        return
    if persistence is None:
        raise ParameterError(f"{security.value} needs the persistence file's path")
    persistence.parent.mkdir(parents=True, exist_ok=True)
    with open(persistence, "wb") as fh:
        fh.write(REP3_HEADER)
        for _, comps in given:
            a, b = comps[own], comps[prev]
            for start in range(0, a.size, _WRITE_ENTRIES):
                stop = min(a.size, start + _WRITE_ENTRIES)
                pair = np.empty((stop - start, 2), dtype="<u8")
                pair[:, 0] = a[start:stop]
                pair[:, 1] = b[start:stop]
                fh.write(pair.tobytes())


def _schedule_for_hash(data: bytes) -> bytes:
    """The schedule without what varies between identical compilations: the compiler's
    command line (paths) and the order of the options it lists (a Python set)."""
    out = []
    for ln in data.split(b"\n"):
        if b"compile.py" in ln:
            continue
        if ln.startswith(b"opts:"):
            ln = b"opts: " + b" ".join(sorted(ln[5:].split()))
        out.append(ln)
    return b"\n".join(out)


def tree_hash(programs: Path, name: str) -> str:
    """SHA-256 over the program's bytecode files and schedule (names and contents)."""
    files = sorted((programs / "Bytecode").glob(f"{name}-*.bc"))
    files.append(programs / "Schedules" / f"{name}.sch")
    h = hashlib.sha256()
    for f in files:
        data = f.read_bytes()
        if f.suffix == ".sch":
            data = _schedule_for_hash(data)
        rel = f.relative_to(programs).as_posix().encode()
        h.update(len(rel).to_bytes(4, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


@functools.cache
def _compiler_fingerprint(home: Path) -> str:
    h = hashlib.sha256()
    for f in sorted((home / "Compiler").rglob("*.py")):
        h.update(f.relative_to(home).as_posix().encode() + b"\0" + f.read_bytes())
    h.update((home / "compile.py").read_bytes())
    return h.hexdigest()


class _Capture:
    """Drain a pipe into a file, keeping at most ``cap`` bytes.

    With ``on_progress``, the program's progress lines are handed to it as they come
    and not kept (however many there are, they never crowd out what the cap keeps)."""

    def __init__(
        self, path: Path, cap: int = LOG_CAP,
        on_progress: Callable[[bytes], None] | None = None,
    ) -> None:
        self.path = path
        self.cap = cap
        self.kept = bytearray()
        self.on_progress = on_progress
        self.taken = 0  # bytes read from the pipe so far, progress lines included
        self._partial = b""

    def _keep(self, data: bytes) -> None:
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    def _take(self, chunk: bytes) -> None:
        if self.on_progress is None:
            self._keep(chunk)
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            if line.startswith(PROGRESS_PREFIX):
                self.on_progress(line)
            else:
                self._keep(line + b"\n")

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                break
            self.taken += len(chunk)
            self._take(chunk)
        if self._partial:
            self._keep(self._partial)
            self._partial = b""
        with open(self.path, "wb", opener=private_opener) as fh:
            fh.write(bytes(self.kept))


# The program's stages in the order it runs them (step2a.mpc, progress()), as a user
# reads them, and what a stage's counter counts when it has one.
STAGES: dict[str, tuple[str, str]] = {
    "inputs": ("reading and checking the inputs", ""),
    "thresholds": ("mean-split thresholds", ""),
    "comparisons": ("mean-split comparisons", "rows"),
    "scores": ("class counts and scores", ""),
    "ranking": ("ranking the features", ""),
    "selection": ("building D'", "rows"),
    "training": ("training", "SGD steps"),
    "opening": ("opening the masked result", ""),
}


@dataclass(frozen=True)
class ProgressPlan:
    """Turns the program's progress lines into how far the secure computation is.

    Each stage gets the share of the run its work takes (``stage_weights``: a cost model
    of the shape, measured per setting), so the fraction grows roughly with time."""

    spans: dict[str, tuple[float, float]]

    @classmethod
    def for_shape(cls, shape: Step2AShape, security: Security) -> ProgressPlan:
        weights = stage_weights(shape, security)
        total = sum(weights.values())
        spans: dict[str, tuple[float, float]] = {}
        at = weights.get("start", 0.0) / total
        for stage in STAGES:
            share = weights.get(stage, 0.0) / total
            spans[stage] = (at, at + share)
            at += share
        return cls(spans)

    def note(self, line: bytes) -> ProgressNote | None:
        """The note for one line, or None for a line that is not a well-formed one."""
        fields = line.removeprefix(PROGRESS_PREFIX).split()
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            return None
        stage = fields[0].decode("ascii", "replace")
        done, total = int(fields[1]), int(fields[2])
        if stage not in self.spans or total < 1 or done > total:
            return None
        start, end = self.spans[stage]
        text, unit = STAGES[stage]
        if unit and total > 1:
            text += f", {done:,} of {total:,} {unit}"
        return ProgressNote(text, start + (end - start) * done / total)


def _progress_lines(
    plan: ProgressPlan, progress: Progress | None
) -> Callable[[bytes], None] | None:
    """What hands the program's progress lines to ``progress`` as notes."""
    if progress is None:
        return None
    report = progress

    def take(line: bytes) -> None:
        note = plan.note(line)
        if note is not None:
            report(note)

    return take


# Each stage's cost: what it grows with, and (constant seconds, seconds per unit) in
# passive 3PC, active 3PC and active 4PC, fitted to the stages' times of CogLoad-, LSVT-
# and SPEED-shaped runs on one 2-core machine (only their ratios matter here). "start":
# launching, connecting and the session check, before the program's first line.
_STAGE_COSTS: dict[str, tuple[str, tuple[tuple[float, float], ...]]] = {
    "start": ("m*p", ((0.10, 0.05e-6), (0.16, 0.48e-6), (0.17, 0.1e-6))),
    "inputs": ("m*p", ((0, 0.09e-6), (0, 0.67e-6), (0, 0.97e-6))),
    "thresholds": ("m*p", ((0.02, 0.03e-6), (0.05, 0.5e-6), (0.1, 0.33e-6))),
    "comparisons": ("m*p", ((0, 0.27e-6), (0, 2.7e-6), (0, 1.4e-6))),
    "scores": ("p", ((0.03, 0), (0.05, 0), (0.07, 0))),
    "ranking": ("p*p", ((0.005, 0.3e-6), (0.005, 3e-6), (0.005, 1.8e-6))),
    "selection": ("m*p*k", ((0, 2.8e-9), (0, 19e-9), (0, 18e-9))),
    "training": ("m*k*epochs", ((0, 0.95e-6), (0, 5.9e-6), (0, 2.6e-6))),
    "opening": ("m*k", ((0.03, 0.2e-6), (0.06, 0.5e-6), (0.05, 0.5e-6))),
}
_COST_COLUMN = {Security.PASSIVE_3PC: 0, Security.ACTIVE_3PC: 1, Security.ACTIVE_4PC: 2}


def stage_weights(shape: Step2AShape, security: Security) -> dict[str, float]:
    """Each stage's estimated seconds (``_STAGE_COSTS``) for this shape; "training" only
    with Step 2B, "selection" (D') only where it is revealed or trained on."""
    m, p, k = shape.m, shape.p, shape.k
    epochs = shape.train.epochs if shape.train is not None else 0
    units = {"p": p, "p*p": p * p, "m*p": m * p, "m*p*k": m * p * k, "m*k": m * k,
             "m*k*epochs": m * k * epochs}
    column = _COST_COLUMN.get(security, 1)
    weights = {}
    for stage, (unit, costs) in _STAGE_COSTS.items():
        constant, per_unit = costs[column]
        weights[stage] = constant + per_unit * units[unit]
    if shape.train is None:
        del weights["training"]
        if not shape.reveal_reduced:
            del weights["selection"]
    return weights


@dataclass
class _Party:
    index: int
    proc: asyncio.subprocess.Process
    out: _Capture
    err: _Capture
    started: float
    drains: asyncio.Future[tuple[None, None]]
    peak_rss_file: Path  # where its launcher writes the binary's peak memory when it ends
    ended: float | None = None
    stopped_by_us: bool = False

    @property
    def peak_rss(self) -> int | None:
        """The engine binary's peak resident memory in bytes, once it has ended."""
        return read_peak_rss(self.peak_rss_file)

    @property
    def name(self) -> str:
        return PARTY_NAMES[self.index]


class MpSpdzEngine:
    name = "mp-spdz"

    def __init__(
        self,
        home: Path,
        *,
        cache_dir: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        stall_seconds: float | None = DEFAULT_STALL_SECONDS,
        peer_view: PeerView | None = None,
    ) -> None:
        self.home = Path(home)
        # absolute: parties and compiler run with their own directory as cwd
        self.cache_dir = (cache_dir if cache_dir is not None else default_cache_dir()).absolute()
        self.timeout = timeout
        # stop a run in which no party computed or printed for this long (None: never)
        self.stall_seconds = stall_seconds
        # embedded runs only: where each party dials its peers (None: where they listen)
        self.peer_view = peer_view
        # party binaries whose integrity check passed (mpspdz_check), by (path, size, mtime)
        self._checked: set[tuple[str, int, int]] = set()

    # ------------------------------------------------------------------ availability
    def unavailable_reason(self) -> str | None:
        if not self.home.is_dir():
            return (f"MP-SPDZ home {self.home} does not exist (set MPSPDZ_HOME, or run "
                    "ppfs engine install mp-spdz)")
        if not (self.home / "compile.py").is_file() or not (self.home / "Compiler").is_dir():
            return f"MP-SPDZ compiler (compile.py, Compiler/) not found in {self.home}"
        if not any(self._binary(s).is_file() for s in PROTOCOLS):
            names = ", ".join(p.binary for p in PROTOCOLS.values())
            return f"no MP-SPDZ party binary ({names}) in {self.home}"
        return None

    def supports(self, security: Security) -> bool:
        if security not in PROTOCOLS:
            return False
        b = self._binary(security)
        return b.is_file() and os.access(b, os.X_OK)

    def _binary(self, security: Security) -> Path:
        """Top level (a local build), else under bin/ as a release tarball has them."""
        name = PROTOCOLS[security].binary
        top = self.home / name
        if top.is_file():
            return top
        for sub in cpu_bin_dirs():
            packaged = self.home / "bin" / sub / name
            if packaged.is_file():
                return packaged
        return top

    # ------------------------------------------------------------------ compile
    async def compile(
        self, shape: Step2AShape, security: Security, progress: Progress | None = None
    ) -> tuple[Path, str, str]:
        """Compile (or reuse) the program; returns (Programs dir, program name, hash).

        Active 3PC first checks that the party binary's MAC check rejects a forged MAC
        (:func:`ppfs.engines.mpspdz_check.check_spdzwise`) and refuses the build if not."""
        if security is Security.ACTIVE_3PC:
            await self._check_integrity(security, progress)
        protocol = PROTOCOLS[security]
        args = compile_args(shape, security)
        name = program_name(shape, security)
        source = program_source()
        key = hashlib.sha256(
            b"\0".join(
                [CACHE_LAYOUT, source, scoring_source(), protocol.compile_flag.encode(),
                 *(f.encode() for f in COMPILE_FLAGS),
                 *(a.encode() for a in args),
                 _compiler_fingerprint(self.home).encode()]
            )
        ).hexdigest()[:32]
        final = self.cache_dir / key
        hash_file = final / "program.sha256"
        if hash_file.is_file():
            return final / "Programs", name, hash_file.read_text().strip()
        if progress:
            progress(f"compiling the MP-SPDZ program for {security.value} (cached afterwards)")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".tmp-{uuid.uuid4().hex}"
        src_dir = tmp / "Programs" / "Source"
        src_dir.mkdir(parents=True)
        src = src_dir / f"{PROGRAM}.mpc"
        src.write_bytes(source)
        log = _Capture(tmp / "compile.log")
        try:
            proc = await asyncio.create_subprocess_exec(
                *compile_command(self.home, src.relative_to(tmp), shape, security),
                cwd=tmp, stdin=asyncio.subprocess.DEVNULL,
                # a fixed hash seed: the compiler iterates over sets, and every party
                # must produce the same program from the same description
                env={**os.environ, "PYTHONHASHSEED": "0"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )
            try:
                await asyncio.wait_for(
                    asyncio.gather(log.drain(proc.stdout), proc.wait()), self.timeout
                )
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise EngineError("compiling the MP-SPDZ program timed out") from None
            if proc.returncode != 0:
                raise EngineError(
                    f"compiling the MP-SPDZ program failed (exit {proc.returncode}); "
                    f"compiler log kept in {tmp / 'compile.log'}"
                )
            digest = tree_hash(tmp / "Programs", name)
            (tmp / "program.sha256").write_text(digest + "\n")
            try:
                tmp.rename(final)
            except OSError:
                # another run compiled the same program first: use that one
                shutil.rmtree(tmp, ignore_errors=True)
                if not hash_file.is_file():
                    raise EngineError("the MP-SPDZ program cache is inconsistent") from None
                digest = hash_file.read_text().strip()
        except BaseException:
            if tmp.exists() and not (tmp / "compile.log").is_file():
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final / "Programs", name, digest

    async def _check_integrity(self, security: Security, progress: Progress | None) -> None:
        binary = self._binary(security)
        st = binary.stat()
        key = (str(binary), st.st_size, st.st_mtime_ns)
        if key in self._checked:
            return
        if progress:
            progress("checking that this MP-SPDZ build rejects a forged MAC (once per build)")
        await check_spdzwise(self.home, binary, self.cache_dir)
        self._checked.add(key)

    # ------------------------------------------------------------------ set-up
    async def prepare(self, shape: Step2AShape, security: Security) -> str:
        """Compile (or find in the cache) the program; returns its bytecode SHA-256."""
        if not self.supports(security):
            raise EngineError(f"MP-SPDZ here does not run {security.value}")
        _, _, digest = await self.compile(shape, security)
        return digest

    def mpc_subject(self, party: int) -> tuple[str, bool]:
        # MP-SPDZ checks a peer's certificate for the host name "P<j>".
        return f"P{party}", True

    def _embedded_specs(
        self, inputs: Step2AInputs, dirs: Sequence[Path]
    ) -> list[PartyRunSpec]:
        """Embedded mode: a fresh per-run CA signs each party's CSR; the keys are
        generated in the parties' own directories and the CA is then discarded."""
        security = inputs.security
        n = security.parties
        if len(inputs.party_dirs) != n or len(dirs) != n:
            raise ParameterError(f"{security.value} needs {n} party directories")
        ca = CertificateAuthority.create("ppfs MP-SPDZ run CA")
        tls_root = dirs[0].parent / "tls"
        if tls_root.exists():
            shutil.rmtree(tls_root)
        private_dir(tls_root)
        ports = free_ports(n)
        peers = tuple(("127.0.0.1", port) for port in ports)
        specs = []
        for i, d in enumerate(dirs):
            own = private_dir(tls_root / f"P{i}")
            csr = party_key_and_csr(own / f"P{i}.key", self.mpc_subject(i)[0])
            write_cert(own / f"P{i}.pem", ca.issue(csr))
            write_cert(own / "ppfs-ca.pem", ca.cert)
            specs.append(PartyRunSpec(
                security=security, shape=inputs.shape, party=i,
                input_dir=inputs.party_dirs[i], workdir=d, peers=peers,
                tls=PartyTls(own / f"P{i}.key", own / f"P{i}.pem", own / "ppfs-ca.pem"),
                dial=self.peer_view(i, peers) if self.peer_view is not None else None,
            ))
        make_private(tls_root)
        return specs

    def _setup_party(self, spec: PartyRunSpec, programs: Path, name: str, digest: str,
                     hashed: dict[Path, str] | None = None) -> None:
        """One party's working directory: Player-Data (its key and certificate, the
        deployment CA, hashed for OpenSSL's lookup), the program, HOSTS and its input.

        The program it links is hashed and checked; with ``hashed``, once per program
        directory (the parties of an embedded run all link the same one)."""
        i, d = spec.party, spec.workdir
        if len(spec.peers) != spec.security.parties or not 0 <= i < spec.security.parties:
            raise ParameterError(
                f"{spec.security.value} needs one MPC address per party and a valid index"
            )
        hosts = spec.dial_addresses()  # the party binds the port of its own line
        if d.exists():
            shutil.rmtree(d)
        # for this user alone from the start, whatever the umask and the folder above
        pdata = private_dir(d / "Player-Data")
        (pdata / f"P{i}.key").symlink_to(spec.tls.key.resolve())
        for fname, path in ((f"P{i}.pem", spec.tls.cert), ("ppfs-ca.pem", spec.tls.ca_cert)):
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            write_cert(pdata / fname, cert)
            hash_link(pdata, fname, subject_hash(cert))
        (d / "Programs").symlink_to(programs.resolve(), target_is_directory=True)
        (d / "HOSTS").write_text("".join(f"{host}:{port}\n" for host, port in hosts))
        write_party_input(spec.security, spec.shape, i, spec.input_dir,
                          pdata / f"Input-Binary-P{i}-0", spec.session_tag or 0,
                          persistence_file(d, i), memory_file(d, i), spec.take_bundles())
        make_private(d)  # its input file and copies of share components, HOSTS
        linked = (d / "Programs").resolve()
        own = hashed.get(linked) if hashed is not None else None
        if own is None:
            own = tree_hash(linked, name)
            if hashed is not None:
                hashed[linked] = own
        for expected in (digest, spec.program_hash):
            if expected is not None and own != expected:
                raise EngineError(
                    f"{PARTY_NAMES[i]}'s copy of the MP-SPDZ program differs from the "
                    "expected one",
                    party=PARTY_NAMES[i],
                )

    # ------------------------------------------------------------------ run
    async def run_step2a(
        self, inputs: Step2AInputs, workdir: Path, progress: Progress | None = None
    ) -> EngineRun:
        security, shape = inputs.security, inputs.shape
        if not self.supports(security):
            raise EngineError(f"MP-SPDZ here does not run {security.value}")
        t_compile = time.perf_counter()
        programs, name, digest = await self.compile(shape, security, progress)
        compile_seconds = time.perf_counter() - t_compile
        root = Path(workdir) / "mpspdz"
        dirs = [root / f"P{i}" for i in range(security.parties)]
        if progress:
            progress("preparing the parties' working directories, keys and inputs")
        t_setup = time.perf_counter()
        try:
            # a cancel waits for the set-up in hand: its cleanup must come after its writes
            specs = await to_thread_to_the_end(self._embedded_specs, inputs, dirs)
            hashed: dict[Path, str] = {}
            for spec in specs:
                await to_thread_to_the_end(self._setup_party, spec, programs, name, digest,
                                           hashed)
            if progress:
                progress(
                    f"starting {security.parties} MP-SPDZ parties ({PROTOCOLS[security].binary})"
                )
            t0 = time.perf_counter()
            setup_seconds = t0 - t_setup
            parties = await self._launch(specs, name, _progress_lines(
                ProgressPlan.for_shape(shape, security), progress))
            if progress:
                progress("running the secure computation")
            await self._supervise(parties)
            opened = _read_opened(dirs, shape)
        finally:
            for d in dirs:
                remove_share_copies(d)
        stats = [
            PartyStats(
                party=p.name,
                exit_code=p.proc.returncode,
                seconds=(p.ended or time.perf_counter()) - p.started,
                bytes_sent=_bytes_sent(bytes(p.err.kept)),
                rounds=_rounds(bytes(p.err.kept)),
                peak_rss_bytes=p.peak_rss,
            )
            for p in parties
        ]
        if progress:
            progress("secure computation done")
        return EngineRun(
            engine=self.name,
            opened=opened,
            seconds=time.perf_counter() - t0,
            bytes_sent=sum(s.bytes_sent for s in stats),
            parties=stats,
            program_hash=digest,
            compile_seconds=compile_seconds,
            setup_seconds=setup_seconds,
            rounds=max(s.rounds for s in stats),
        )

    async def _launch(
        self, specs: Sequence[PartyRunSpec], name: str,
        on_progress: Callable[[bytes], None] | None = None,
    ) -> list[_Party]:
        """Launch every party; ``on_progress`` takes party 0's progress lines."""
        parties: list[_Party] = []
        try:
            for spec in specs:
                parties.append(await self._launch_party(
                    spec, name, on_progress if spec.party == 0 else None))
        except BaseException:
            await _stop_all(parties)
            raise
        return parties

    async def _launch_party(
        self, spec: PartyRunSpec, name: str,
        on_progress: Callable[[bytes], None] | None = None,
    ) -> _Party:
        binary = str(self._binary(spec.security))
        env = party_env(self.home)
        d = spec.workdir
        # absolute: the launcher opens it from inside d (cwd), where a relative path
        # would name d/d/peak-rss
        peak_file = (d / "peak-rss").absolute()
        # launched through ppfs.engines.pdeathsig: it dies with this process, and its
        # launcher reports its peak memory when it ends
        proc = await asyncio.create_subprocess_exec(
            *pdeathsig.command(), "--peak-rss", str(peak_file),
            # -OF .: every party prints what the program prints (its progress and its
            # markers), not party 0 alone
            binary, "-p", str(spec.party), "--ip-file-name", "HOSTS", "-v", "-OF", ".",
            "-o", "no_memory_output", *preprocessing_batch(spec.shape, spec.security),
            *(["-m", "old"] if spec.security in MEMORY_INPUT else []), name,
            cwd=d, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            # what the party writes (its MAC keys, opened words, peak memory): ours alone
            umask=PRIVATE_UMASK,
        )
        out = _Capture(d / "stdout.log", on_progress=on_progress)
        err = _Capture(d / "stderr.log")
        drains = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))
        return _Party(spec.party, proc, out, err, time.perf_counter(), drains, peak_file)

    async def run_party(
        self, spec: PartyRunSpec, progress: Progress | None = None
    ) -> PartyRunResult:
        """Run this party only (a party daemon's call): set up, launch, watch, read
        its own copy of the opened words. Cancelling kills the party's process."""
        security, shape = spec.security, spec.shape
        if not self.supports(security):
            raise EngineError(f"MP-SPDZ here does not run {security.value}")
        programs, name, digest = await self.compile(shape, security, progress)
        timeout = spec.timeout if spec.timeout is not None else self.timeout
        if progress:
            progress("preparing the working directory and input")
        try:
            # a cancel waits for the set-up: its cleanup must come after the input's writes
            await to_thread_to_the_end(self._setup_party, spec, programs, name, digest)
            if progress:
                progress(f"starting MP-SPDZ party {spec.party} ({PROTOCOLS[security].binary})")
            t0 = time.perf_counter()
            party = await self._launch_party(spec, name, _progress_lines(
                ProgressPlan.for_shape(shape, security), progress))
            if progress:
                progress("running the secure computation")
            stall = spec.stall_timeout if spec.stall_timeout is not None else self.stall_seconds
            await self._supervise([party], timeout, stall, every_party=False)
            opened = read_party_output(output_file(spec.workdir, spec.party), spec.party, shape)
        finally:
            remove_share_copies(spec.workdir)
        if progress:
            progress("secure computation done")
        return PartyRunResult(
            party=spec.party,
            opened=opened,
            seconds=time.perf_counter() - t0,
            bytes_sent=_bytes_sent(bytes(party.err.kept)),
            exit_code=party.proc.returncode or 0,
            program_hash=digest,
            peak_rss_bytes=party.peak_rss,
        )

    async def _supervise(
        self, parties: list[_Party], timeout: float | None = None,
        stall: float | None = None, *, every_party: bool = True,
    ) -> None:
        """Wait for the parties to end; the first failure stops them all. The run is
        stopped at its time limit (``timeout``, else the engine's), and once no party
        computed or printed for ``stall`` seconds (:mod:`ppfs.engines.stall`; None:
        the engine's ``stall_seconds``). ``every_party``: ``parties`` are all of the
        run's (embedded), so a stopped one can be named."""
        timeout = self.timeout if timeout is None else timeout
        stall = self.stall_seconds if stall is None else stall
        watch = StallWatch(stall) if stall and proc_available() else None
        waits = {asyncio.ensure_future(p.proc.wait()): p for p in parties}
        deadline = time.perf_counter() + timeout
        failed: _Party | None = None
        waited: float | None = None
        try:
            pending = set(waits)
            while pending:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise TimedOutError(
                        f"the MP-SPDZ run exceeded its time limit of {timeout:g} s"
                    )
                done, pending = await asyncio.wait(
                    pending, timeout=remaining if watch is None else min(remaining,
                                                                         SAMPLE_SECONDS),
                    return_when=asyncio.FIRST_COMPLETED
                )
                now = time.perf_counter()
                for fut in done:
                    p = waits[fut]
                    p.ended = now
                    if p.proc.returncode != 0 and failed is None:
                        failed = p
                        # how long this party had waited when its run stopped: the
                        # gateway weighs a peer's stall report against it
                        waited = None if watch is None else watch.idle_seconds(now)
                if failed is not None:
                    break
                if watch is not None and pending:
                    watch.observe(now, {p.index: sample_tree(p.proc.pid) for p in parties
                                        if p.proc.returncode is None},
                                  sum(p.out.taken + p.err.taken for p in parties))
                    if watch.stalled:
                        raise _stalled(parties, watch, every_party)
            if failed is not None and pending:
                # let the others notice and stop on their own (and party 0 print why)
                await asyncio.wait(pending, timeout=GRACE_SECONDS)
        finally:
            await _stop_all(parties)
            for fut in waits:
                if not fut.done():
                    fut.cancel()
        if failed is not None:
            if any(SESSION_MARKER in bytes(p.out.kept) for p in parties):
                raise SessionMismatchError(
                    "the MP-SPDZ peers run another job (session tags differ); "
                    "no data was input"
                )
            if any(failed_a_mac_check(bytes(p.err.kept)) for p in parties):
                raise IntegrityError(
                    "integrity check failed: a server's shares or messages do not agree "
                    "with the others' (it altered its share or deviated from the "
                    "protocol); the run stopped"
                    + (", nothing was revealed" if not any(
                        OPENING_MARKER in bytes(p.out.kept) for p in parties) else
                       " and its result was discarded"),
                )
            if any(INTEGRITY_MARKER in bytes(p.out.kept) for p in parties):
                raise IntegrityError(
                    "integrity check failed: the parties' copies or inputs of the share "
                    "components do not agree (a server altered its share, or a data owner "
                    "sent two servers different copies); nothing was revealed",
                )
            for marker, kind in RANGE_MARKERS.items():
                if any(marker in bytes(p.out.kept) for p in parties):
                    # every party opened the same public bit; none is to blame
                    raise RangeAbortError(step2b.abort_message(kind))
            culprit = _culprit(parties, failed)
            code = culprit.proc.returncode
            why = (f"was killed by signal {-code}" if code is not None and code < 0
                   else f"failed with exit code {code}")
            stderr = bytes(culprit.err.kept)
            lost = code is not None and code > 0 and (
                _lost_a_peer(stderr) or b"encountered a problem" in stderr
                or b"closed" in stderr)
            error = PeerLostError if lost else EngineError
            raise error(
                f"MP-SPDZ party {culprit.index} ({culprit.name}) {why}"
                f"{_reason(bytes(culprit.err.kept))}; its log is in its working directory",
                party=culprit.name, waited=waited,
            )


def _stalled(parties: Sequence[_Party], watch: StallWatch, every_party: bool) -> EngineError:
    """The error for a run that made no progress for ``watch.limit`` seconds."""
    error = _stalled_error(parties, watch, every_party)
    error.waited = watch.idle_seconds(watch.last_at)
    return error


def _stalled_error(parties: Sequence[_Party], watch: StallWatch,
                   every_party: bool) -> EngineError:
    limit = f"{watch.limit:g} s"
    stopped = sorted(watch.stopped)
    if every_party and stopped:
        names = ", ".join(f"{i} ({PARTY_NAMES[i]})" for i in stopped)
        return StalledError(
            f"the MP-SPDZ run made no progress for {limit}: party {names} is stopped "
            "(its engine process is suspended), and the others wait for it; the run "
            "stopped",
            party=PARTY_NAMES[stopped[0]],
        )
    if stopped:  # a party daemon whose own engine is suspended: its own failure
        name = PARTY_NAMES[parties[0].index]
        return EngineError(
            f"the MP-SPDZ run made no progress for {limit}: this party's ({name}) engine "
            "process is stopped (suspended); the run stopped",
            party=name,
        )
    who = ("no party computed or printed" if every_party else
           "this party neither computed nor printed, waiting for its peers")
    return StalledError(
        f"the MP-SPDZ run made no progress for {limit} ({who}): a peer stopped answering "
        "(its engine frozen, or its connection cut off"
        + ("" if every_party else "; which peer cannot be seen from here")
        + "); the run stopped"
    )


_PEER_FAILURE = re.compile(rb"probably because party ([0-9]+) encountered a problem")
# MP-SPDZ's report of a failed TLS handshake: "<side>-side handshake with P<j> failed",
# its help text (which mentions certificates whatever the cause), then "SSL error: ..."
_HANDSHAKE_FAILURE = re.compile(rb"(?:Client|Server)-side handshake with P([0-9]+) failed")
_SSL_ERROR = re.compile(rb"SSL error: ([^\n]*)")
# what an error text says when the other end went away (closed, killed, reset) rather
# than, in a handshake, refused a certificate
_GONE = (b"stream truncated", b"end of file", b"short read", b"unexpected eof",
         b"reset by peer", b"broken pipe", b"connection refused")


# MP-SPDZ's own end_of_file exception (Tools/Exceptions.h): a short read of a file of the
# party's own (its input, memory or key files), never a peer's closed connection
_OWN_FILE_ENDED = b"end of file when reading"


def _gone(detail: bytes) -> bool:
    """True when an error text says the other end went away (closed, killed, reset)."""
    detail = detail.lower().replace(_OWN_FILE_ENDED, b"")
    return any(needle in detail for needle in _GONE)


def _handshake(stderr: bytes) -> tuple[int, bytes] | None:
    """(peer, SSL error text) when the party stopped in a TLS handshake, else None.

    A text that says the peer went away (its process stopped) is a symptom, not a
    fault of this party; any other means a certificate was refused."""
    m = _HANDSHAKE_FAILURE.search(stderr)
    if m is None:
        return None
    err = _SSL_ERROR.search(stderr)
    return int(m.group(1)), err.group(1) if err is not None else b""


# MP-SPDZ's report of the exception that stopped it: "Fatal error: <what>" from a thread,
# "Fatal error at <program>:<pc> (<INSTRUCTION>): <what>" from the instruction that was
# running (an active run's own thread reading from or writing to a peer that was killed)
_FATAL = re.compile(rb"Fatal error(?: at \S+ \(\w+\))?: ([^\n]*)")


def _lost_peers(stderr: bytes) -> list[int]:
    """The peers the party's log says it lost."""
    lost = [int(m.group(1)) for m in _PEER_FAILURE.finditer(stderr)]
    shake = _handshake(stderr)
    if shake is not None and _gone(shake[1]):
        lost.append(shake[0])
    return lost


def _lost_a_peer(stderr: bytes) -> bool:
    """True when the party's own log says it stopped because a peer went away."""
    return (bool(_lost_peers(stderr))
            or b"Fatal error in communication" in stderr
            # no peer came within the connect time-out: its job may never have started
            # there (a symptom here, named where it is: the gateway asks every party)
            or _NO_PEER_CONNECTED in stderr or _PEER_UNREACHABLE in stderr
            # a peer gone between the handshake and the program, or during it inside an
            # instruction ("read_some: stream truncated", "write_some: Broken pipe"),
            # unnamed
            or _cut_off(stderr))


def _cut_off(stderr: bytes) -> bool:
    """True when the exception that stopped the party says a peer went away."""
    fatal = _FATAL.search(stderr)
    return fatal is not None and _gone(fatal.group(1))


def _culprit(parties: Sequence[_Party], first: _Party) -> _Party:
    """The party that most likely caused a failed run.

    When one party fails, its peers fail too, with communication errors that name
    the party they lost ("probably because party X encountered a problem"). Prefer
    a party killed by a signal we did not send, then a party that failed for a reason
    of its own, then the party its peers blame; else the first to stop.
    """
    failed = [p for p in parties if p.proc.returncode not in (0, None) and not p.stopped_by_us]
    for p in failed:
        if (p.proc.returncode or 0) < 0:
            return p
    own = [p for p in failed if not _lost_a_peer(bytes(p.err.kept))]
    if len(own) == 1:
        return own[0]
    blamed: dict[int, int] = {}
    for p in parties:
        for i in _lost_peers(bytes(p.err.kept)):
            if 0 <= i < len(parties) and i != p.index:
                blamed[i] = blamed.get(i, 0) + 1
    if blamed:
        return parties[max(blamed, key=lambda i: (blamed[i], -i))]
    return own[0] if own else first


async def _stop_all(parties: Sequence[_Party]) -> None:
    """Kill every party process still running and wait for it and its pipes."""
    for p in parties:
        if p.proc.returncode is None:
            p.stopped_by_us = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, 9)
    for p in parties:
        await p.proc.wait()
        if p.ended is None:
            p.ended = time.perf_counter()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(p.drains, 10)


# What a party's working directory holds of its shares while it runs: its input file,
# its persisted shares (passive 3PC), its memory file and the shares of the MAC keys
# MP-SPDZ writes itself (active 3PC).
SHARE_COPIES = ("Player-Data/Input-Binary-P*", "Player-Data/Memory-*",
                "Persistence/Transactions-P*.data", "Player-Data/*/Player-MAC-Keys-*")


def remove_share_copies(party_dir: Path) -> None:
    """Delete MP-SPDZ's copies of share data in one party's working directory; its
    logs, certificates and (masked) output stay."""
    for pattern in SHARE_COPIES:
        for f in party_dir.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


_NO_PEER_CONNECTED = b"Timed out waiting for peer"
_PEER_UNREACHABLE = b"cannot connect from "

_REASONS = (
    (b"program differs between parties", "the parties run different programs"),
    (b"failure reading from Player-Data/Input", "it could not read its input file"),
    (b"ot enough input", "its input file is too short"),
    (b"EOF when reading from disk", "its input file is too short"),
    (b"Persistence not found", "its input file is missing"),
    (b"ignature in", "its input file is not in MP-SPDZ's format"),
    (b"Invalid memory file", "its input file (memory file) is short or malformed"),
    (b"Memory-", "its input file (memory file) is missing"),
    (b"Address already in use", "its network port was taken"),
    (b"ould not bind", "its network port was taken"),
    (b"certificate", "a TLS certificate was rejected"),
    (b"MAC check", "a MAC check failed"),
    # MP-SPDZ's connect time-out (Networking/sockets.h: 60 s), listening and dialling
    (_NO_PEER_CONNECTED, "no peer's engine connected to it within 60 s: is the job running "
                         "at every party?"),
    (_PEER_UNREACHABLE, "it could not reach a peer's engine within 60 s: is the job running "
                        "at every party, and that party's MPC port reachable from here?"),
    (b"encountered a problem", "a peer stopped first"),
    (b"closed", "a connection was closed"),
    (b"imeout", "a connection timed out"),
)


def _reason(stderr: bytes) -> str:
    """A fixed, redacted reason from a party's stderr (never the text itself)."""
    shake = _handshake(stderr)
    if shake is not None:
        peer, detail = shake
        name = PARTY_NAMES[peer] if 0 <= peer < len(PARTY_NAMES) else f"party {peer}"
        if _gone(detail):
            return f" (its TLS handshake with {name} was cut short: {name} went away)"
        if b"verify failed" in detail:
            why = f"it rejected {name}'s TLS certificate"
        elif b"alert" in detail:
            why = f"{name} rejected its TLS certificate"
        else:
            why = "a TLS certificate was rejected"
        return f" (its TLS handshake with {name} failed: {why})"
    for needle, reason in _REASONS:
        if needle in stderr:
            return f" ({reason})"
    if _cut_off(stderr):
        return " (a peer's connection was cut: that peer went away)"
    return ""


def _bytes_sent(stderr: bytes) -> int:
    m = _SENT_RE.search(stderr)
    if m is None:
        return 0
    try:
        return int(float(m.group(1)) * 1e6)
    except ValueError:
        return 0


def _rounds(stderr: bytes) -> int:
    m = _ROUNDS_RE.search(stderr)
    return int(m.group(1)) if m is not None else 0


def output_file(party_dir: Path, party: int) -> Path:
    """Where MP-SPDZ party ``party`` writes the opened (masked) words."""
    return party_dir / "Player-Data" / f"Binary-Output-P{party}-0"


def read_party_output(path: Path, party: int, shape: Step2AShape) -> np.ndarray:
    name = PARTY_NAMES[party]
    if not path.is_file():
        raise EngineError(f"MP-SPDZ party {name} wrote no output", party=name)
    data = path.read_bytes()
    if len(data) != 8 * shape.outputs:
        raise EngineError(
            f"{name}'s MP-SPDZ output has {len(data) // 8} words, expected {shape.outputs}",
            party=name,
        )
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


def _read_opened(dirs: Sequence[Path], shape: Step2AShape) -> np.ndarray:
    """Every party writes the opened words; they must agree (a party cannot forge them)."""
    outputs = [read_party_output(output_file(d, i), i, shape) for i, d in enumerate(dirs)]
    for i, words in enumerate(outputs[1:], start=1):
        if not np.array_equal(words, outputs[0]):
            raise EngineError(
                f"the parties' opened outputs differ ({PARTY_NAMES[0]} vs {PARTY_NAMES[i]})"
            )
    return outputs[0]


__all__ = [
    "PROTOCOLS",
    "MpSpdzEngine",
    "compile_args",
    "compile_command",
    "default_cache_dir",
    "program_name",
    "remove_share_copies",
    "subject_hash",
    "write_party_input",
]
