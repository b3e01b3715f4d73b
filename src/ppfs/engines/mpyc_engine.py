"""The pure-Python engine: Step 2A on MPyC, one worker process per party.

:class:`MpycEngine` prepares one working directory per party under
``workdir/mpyc/P<i>/`` (job file, TLS key and certificates, status and result
files), starts the parties as ``python -m ppfs.engines.mpyc_party`` and watches
them. Each party's TLS key is generated in its own directory; the per-run CA
signs the certificates and is then discarded.

:meth:`MpycEngine.run_party` runs one party only (a party daemon's call): its
``.config`` links to the daemon's MPC key, its certificate (CN ``MPyC party i``,
no DNS SAN) and the deployment CA. Every party receives the opened (masked) words
and writes them to ``opened.u64`` in its own directory. The program "hash" of MPyC
(:func:`program_hash`) covers the worker's source, the MPyC version and the shape.

Failure handling: when a party exits non-zero the engine kills the others and
raises :class:`~ppfs.errors.EngineError` naming that party; when the run exceeds
its time limit all are killed. Worker output is kept in capped files next to the
job and never copied into an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import ppfs
from ppfs import step2b
from ppfs.durable import free_ports
from ppfs.engines import mpyc_party
from ppfs.engines.base import (
    PARTY_NAMES,
    PRIVATE_UMASK,
    EngineRun,
    PartyRunResult,
    PartyRunSpec,
    PartyStats,
    PartyTls,
    PeerView,
    Progress,
    Step2AInputs,
    make_private,
    private_dir,
    private_opener,
    to_thread_to_the_end,
)
from ppfs.engines.mpyc_party import (
    DEFAULT_CHUNK,
    EXIT_BAD_JOB,
    EXIT_OK,
    EXIT_OUT_OF_RANGE,
    EXIT_PEER_FAULT,
    EXIT_PEER_LOST,
    EXIT_SESSION,
    EXIT_TIMEOUT,
    JOB_VERSION,
)
from ppfs.engines.stall import (
    DEFAULT_STALL_SECONDS,
    SAMPLE_SECONDS,
    StallWatch,
    proc_available,
    sample_tree,
)
from ppfs.errors import (
    EngineError,
    EngineUnavailableError,
    ParameterError,
    PeerLostError,
    RangeAbortError,
    SessionMismatchError,
    StalledError,
    TimedOutError,
)
from ppfs.pki import CertificateAuthority, party_key_and_csr, write_cert
from ppfs.step2a import Security, Step2AShape

log = logging.getLogger("ppfs.engines.mpyc")

SUPPORTED = (Security.PASSIVE_3PC, Security.PASSIVE_4PC)
REQUIRED_VERSION = "0.11"
LOG_CAP = 256 * 1024  # bytes of each worker stream kept on disk
POLL = 0.2
BLAME_GRACE = 2.0  # seconds to wait for the root cause after a "peer lost" exit
KILL_GRACE = 5.0
# A worker stops itself at the run's time limit, naming the peer it waits for; the
# engine kills it only this much later (a worker stuck in a long local step).
WORKER_GRACE = 15.0


def default_timeout(shape: Step2AShape, parties: int) -> float:
    """A generous limit from measured costs (2 cores, 3 parties: ~0.5 ms per
    40-bit comparison element), times 10, plus fixed start-up time."""
    split = shape.m * shape.p * shape.split_bits / 40
    ranking = shape.p * (shape.p - 1) / 2 * shape.rank_bits / 40
    division = shape.p * 62 * 2 + 62 * 200  # per-step latency dominates for small p
    per_elem = 0.5e-3 * (parties / 3)
    return 300.0 + 10 * per_elem * (split + ranking + division)


def program_hash(shape: Step2AShape, security: Security) -> str:
    """SHA-256 over the worker's source, the MPyC version and the public parameters."""
    h = hashlib.sha256()
    h.update(Path(mpyc_party.__file__).read_bytes())
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        h.update(b"\0mpyc " + importlib.metadata.version("mpyc").encode())
    h.update(b"\0" + security.value.encode() + b"\0")
    h.update(json.dumps(shape.to_dict(), sort_keys=True).encode())  # incl. what is opened
    return h.hexdigest()


# A worker's exit code -> the error it stands for (ppfs.contract.failure_kind reads these).
_ERRORS: dict[int, type[EngineError]] = {
    EXIT_PEER_LOST: PeerLostError,
    EXIT_PEER_FAULT: PeerLostError,  # a peer's message it could not take: a symptom
    EXIT_TIMEOUT: TimedOutError,
    EXIT_SESSION: SessionMismatchError,
}


@dataclass
class _Worker:
    index: int
    directory: Path
    proc: asyncio.subprocess.Process
    started: float
    drains: list[asyncio.Task[None]] = field(default_factory=list)
    ended: float | None = None
    printed: int = 0  # bytes the worker wrote to its stdout and stderr so far

    def took(self, n: int) -> None:
        self.printed += n

    @property
    def name(self) -> str:
        return PARTY_NAMES[self.index]


async def _drain(stream: asyncio.StreamReader | None, path: Path, cap: int,
                 took: Callable[[int], None] | None = None) -> None:
    """Copy a worker stream into ``path``, keeping at most ``cap`` bytes; ``took`` is
    told the size of every chunk read."""
    if stream is None:
        return
    kept = 0
    with open(path, "wb", opener=private_opener) as fh:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                break
            if took is not None:
                took(len(chunk))
            if kept < cap:
                part = chunk[: cap - kept]
                fh.write(part)
                kept += len(part)
                if kept >= cap:
                    fh.write(b"\n[output truncated]\n")
                fh.flush()


class MpycEngine:
    """Step 2A on MPyC (passive security, 3 or 4 parties, honest majority)."""

    name = "mpyc"

    def __init__(
        self,
        *,
        timeout: float | None = None,
        start_timeout: float = 60.0,
        chunk: int = DEFAULT_CHUNK,
        bind_host: str = "127.0.0.1",
        log_cap: int = LOG_CAP,
        peer_view: PeerView | None = None,
        stall_seconds: float | None = DEFAULT_STALL_SECONDS,
    ) -> None:
        self.timeout = timeout
        # stop a run in which no worker computed or printed for this long (None: never)
        self.stall_seconds = stall_seconds
        self.start_timeout = start_timeout
        self.chunk = chunk
        self.bind_host = bind_host
        self.log_cap = log_cap
        # embedded runs only: where each party dials its peers (None: where they listen)
        self.peer_view = peer_view

    # -- Engine protocol ------------------------------------------------------

    def unavailable_reason(self) -> str | None:
        # Importing mpyc here would parse this process's argv and reconfigure its
        # root logger; finding the installed distribution is enough.
        for module in ("mpyc", "numpy"):
            if importlib.util.find_spec(module) is None:
                return f"the Python package {module} is not installed"
        try:
            version = importlib.metadata.version("mpyc")
        except importlib.metadata.PackageNotFoundError:
            return "the Python package mpyc is not installed"
        if version != REQUIRED_VERSION:
            return f"mpyc {REQUIRED_VERSION} is required, found {version}"
        return None

    def supports(self, security: Security) -> bool:
        return security in SUPPORTED

    async def prepare(self, shape: Step2AShape, security: Security) -> str:
        """MPyC has nothing to compile: the hash describes the worker program (its
        source and the MPyC version) and the run's public parameters."""
        if not self.supports(security):
            raise EngineUnavailableError(f"engine mpyc does not support {security.value}")
        return program_hash(shape, security)

    def mpc_subject(self, party: int) -> tuple[str, bool]:
        # MPyC checks a peer by the host name "MPyC party <j>", matched against the CN:
        # a certificate with a DNS SAN would hide the CN from that check.
        return f"MPyC party {party}", False

    async def run_step2a(
        self, inputs: Step2AInputs, workdir: Path, progress: Progress | None = None
    ) -> EngineRun:
        security, shape = inputs.security, inputs.shape
        if not self.supports(security):
            raise EngineUnavailableError(f"engine mpyc does not support {security.value}")
        n = security.parties
        if len(inputs.party_dirs) != n:
            raise ParameterError(f"{security.value} needs {n} party input directories")
        timeout = self.timeout if self.timeout is not None else default_timeout(shape, n)

        root = Path(workdir) / "mpyc"
        dirs = [root / f"P{i}" for i in range(n)]
        t_setup = time.monotonic()
        specs = self._embedded_specs(inputs, dirs)
        for spec in specs:
            self._prepare_party(spec, timeout)
        if progress:
            progress(f"mpyc: starting {n} parties ({security.value})")
        t0 = time.monotonic()
        workers: list[_Worker] = []
        try:
            for i, d in enumerate(dirs):
                workers.append(await self._launch(i, d))
            await self._watch(workers, t0 + timeout + WORKER_GRACE, progress,
                              self.stall_seconds)
            seconds = time.monotonic() - t0
            opened = self._read_output(dirs[0] / "opened.u64", shape, 0)
            stats = [self._party_stats(w) for w in workers]
        finally:
            await self._stop(workers)
        if progress:
            progress(f"mpyc: done in {seconds:.1f} s")
        return EngineRun(
            engine=self.name,
            opened=opened,
            seconds=seconds,
            bytes_sent=sum(s.bytes_sent for s in stats),
            parties=stats,
            program_hash=program_hash(shape, security),
            setup_seconds=t0 - t_setup,
        )

    async def run_party(
        self, spec: PartyRunSpec, progress: Progress | None = None
    ) -> PartyRunResult:
        """Run this party only (a party daemon's call). Cancelling kills its worker."""
        security, shape = spec.security, spec.shape
        if not self.supports(security):
            raise EngineUnavailableError(f"engine mpyc does not support {security.value}")
        digest = program_hash(shape, security)
        if spec.program_hash is not None and spec.program_hash != digest:
            raise EngineError(
                f"{spec.name}'s MPyC program differs from the expected one", party=spec.name
            )
        timeout = spec.timeout
        if timeout is None:
            timeout = self.timeout if self.timeout is not None else default_timeout(
                shape, security.parties)
        # a cancel waits for the preparation: it writes the party's input files, which
        # the caller removes once the run is over
        await to_thread_to_the_end(self._prepare_party, spec, timeout)
        if progress:
            progress(f"mpyc: starting party {spec.party} ({security.value})")
        t0 = time.monotonic()
        workers: list[_Worker] = []
        try:
            workers.append(await self._launch(spec.party, spec.workdir))
            stall = spec.stall_timeout if spec.stall_timeout is not None else self.stall_seconds
            await self._watch(workers, t0 + timeout + WORKER_GRACE, progress, stall,
                              every_party=False)
            seconds = time.monotonic() - t0
            opened = self._read_output(spec.workdir / "opened.u64", shape, spec.party)
            stats = self._party_stats(workers[0])
        finally:
            await self._stop(workers)
        if progress:
            progress(f"mpyc: done in {seconds:.1f} s")
        return PartyRunResult(
            party=spec.party, opened=opened, seconds=seconds, bytes_sent=stats.bytes_sent,
            exit_code=EXIT_OK, program_hash=digest,
        )

    # -- preparation -----------------------------------------------------------

    def _embedded_specs(self, inputs: Step2AInputs, dirs: list[Path]) -> list[PartyRunSpec]:
        """Embedded mode: a fresh per-run CA signs each party's CSR (the key is made in
        the party's own directory), then the CA is discarded."""
        ports = free_ports(len(dirs), self.bind_host)
        peers = tuple((self.bind_host, port) for port in ports)
        ca = CertificateAuthority.create("ppfs MPyC run CA")
        specs = []
        for i, d in enumerate(dirs):
            # for this user alone from the start, whatever the umask and folder above
            cfg = private_dir(d / ".config")
            cn, dns_san = self.mpc_subject(i)
            csr = party_key_and_csr(cfg / f"party_{i}.key", cn)
            write_cert(cfg / f"party_{i}.crt", ca.issue(csr, dns_san=dns_san))
            (cfg / "mpyc_ca.crt").write_bytes(ca.cert_pem())
            specs.append(PartyRunSpec(
                security=inputs.security, shape=inputs.shape, party=i,
                input_dir=inputs.party_dirs[i], workdir=d, peers=peers,
                tls=PartyTls(cfg / f"party_{i}.key", cfg / f"party_{i}.crt",
                             cfg / "mpyc_ca.crt"),
                bind_host=self.bind_host,
                dial=self.peer_view(i, peers) if self.peer_view is not None else None,
            ))
        return specs

    def _prepare_party(self, spec: PartyRunSpec, timeout: float) -> None:
        """The party's working directory: ./.config (its TLS key, certificate and the
        CA, where MPyC looks for them) and job.json (public parameters only); the
        party's bundles in its input directory when it was handed them in memory (the
        worker process reads them from there)."""
        i, d, shape = spec.party, spec.workdir, spec.shape
        if len(spec.peers) != spec.security.parties or not 0 <= i < spec.security.parties:
            raise ParameterError(
                f"{spec.security.value} needs one MPC address per party and a valid index"
            )
        spec.write_input_files()
        addresses = spec.dial_addresses()
        cfg = private_dir(d / ".config")
        private_dir(d)
        for stale in ("status.txt", "result.json", "opened.u64", "worker.pid"):
            (d / stale).unlink(missing_ok=True)
        for src, fname in ((spec.tls.key, f"party_{i}.key"), (spec.tls.cert, f"party_{i}.crt"),
                           (spec.tls.ca_cert, "mpyc_ca.crt")):
            target = cfg / fname
            if target.resolve() != src.resolve():
                target.unlink(missing_ok=True)
                target.symlink_to(src.resolve())
        job: dict[str, Any] = {
            "version": JOB_VERSION,
            "party": i,
            "security": spec.security.value,
            "shape": shape.to_dict(),  # incl. Step 2B's parameters and the D' flag
            # MPyC listens on its own entry's port and dials each peer at its entry
            "addresses": [[host, port] for host, port in addresses],
            "bind_host": spec.bind_host,
            "input_dir": str(Path(spec.input_dir).resolve()),
            "status_path": str((d / "status.txt").resolve()),
            "result_path": str((d / "result.json").resolve()),
            "output_path": str((d / "opened.u64").resolve()),
            "start_timeout": self.start_timeout,
            "timeout": timeout,  # the worker's limit acts first (WORKER_GRACE)
            "chunk": self.chunk,
            "ssl": True,
            "session_tag": spec.session_tag or 0,
        }
        (d / "job.json").write_text(json.dumps(job, indent=1))
        make_private(d)

    async def _launch(self, i: int, d: Path) -> _Worker:
        env = dict(os.environ)
        src = str(Path(ppfs.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            [src, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ppfs.engines.mpyc_party",
            "--job", str((d / "job.json").resolve()), "--party", str(i),
            cwd=str(d),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            # what the worker writes (its status, result and opened words): ours alone
            umask=PRIVATE_UMASK,
        )
        with open(d / "worker.pid", "w", opener=private_opener) as fh:
            fh.write(str(proc.pid))
        w = _Worker(i, d, proc, time.monotonic())
        w.drains = [
            asyncio.create_task(_drain(proc.stdout, d / "worker.out", self.log_cap, w.took)),
            asyncio.create_task(_drain(proc.stderr, d / "worker.err", self.log_cap, w.took)),
        ]
        log.info("[MpycEngine.launch] party=%s pid=%d", w.name, proc.pid)
        return w

    # -- monitoring ------------------------------------------------------------

    async def _watch(self, workers: list[_Worker], deadline: float,
                     progress: Progress | None, stall: float | None = None, *,
                     every_party: bool = True) -> None:
        """Wait for the workers to end: the first failure, the ``deadline`` or ``stall``
        seconds in which no worker computed or printed (:mod:`ppfs.engines.stall`;
        None: never) stop the run. ``every_party``: ``workers`` are all of the run's."""
        waits = {asyncio.ensure_future(w.proc.wait()): w for w in workers}
        watch = StallWatch(stall) if stall and proc_available() else None
        next_sample = time.monotonic() + SAMPLE_SECONDS
        relayed = 0
        pending = set(waits)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, timeout=POLL,
                                                   return_when=asyncio.FIRST_COMPLETED)
                now = time.monotonic()
                for fut in done:
                    waits[fut].ended = now
                relayed = self._relay(workers[0].directory / "status.txt", relayed, progress)
                failed = [waits[f] for f in done if waits[f].proc.returncode != 0]
                if any(w.proc.returncode == EXIT_OUT_OF_RANGE for w in failed):
                    # every party opened the same range bit; none is to blame
                    kind = self._result_reason(failed[0])
                    raise RangeAbortError(step2b.abort_message(kind or ""))
                if failed:
                    culprit = await self._culprit(workers, failed)
                    error = _ERRORS.get(culprit.proc.returncode or 0, EngineError)
                    raise error(
                        f"MPyC party {culprit.name} failed: {self._reason(culprit)}",
                        party=self._accused(culprit) or culprit.name,
                        # how long this party had waited when its run stopped: the
                        # gateway weighs a peer's stall report against it
                        waited=None if watch is None else watch.idle_seconds(now),
                    )
                if pending and now > deadline:
                    raise TimedOutError("the MPyC run timed out; all parties were stopped")
                if watch is not None and pending and now >= next_sample:
                    next_sample = now + SAMPLE_SECONDS
                    watch.observe(now, {w.index: sample_tree(w.proc.pid) for w in workers
                                        if w.proc.returncode is None},
                                  sum(w.printed + _status_size(w) for w in workers))
                    if watch.stalled:
                        raise _stalled(workers, watch, every_party)
        finally:
            for fut in pending:
                fut.cancel()

    async def _culprit(self, workers: list[_Worker], failed: list[_Worker]) -> _Worker:
        """The party that failed first for a reason of its own.

        A party that only lost a peer (exit code 3) is a symptom: wait briefly for the
        party that caused it to exit, and blame that one.
        """
        first = min(failed, key=lambda w: (w.ended or 0.0, w.index))
        if first.proc.returncode != EXIT_PEER_LOST:
            return first
        limit = time.monotonic() + BLAME_GRACE
        while time.monotonic() < limit:
            causes = [w for w in workers if w.proc.returncode not in (None, 0, EXIT_PEER_LOST)]
            if causes:
                return min(causes, key=lambda w: w.index)
            await asyncio.sleep(0.05)
        return first

    @staticmethod
    def _reason(w: _Worker) -> str:
        code = w.proc.returncode
        if code is not None and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = str(-code)
            return f"its process was killed by {sig}"
        reason = MpycEngine._result_reason(w)
        if code == EXIT_PEER_LOST:
            return reason or "it lost its connection to another party"
        if code == EXIT_PEER_FAULT:
            return reason or "another party sent it a message it cannot take"
        if code == EXIT_TIMEOUT:
            return reason or "it timed out"
        if code == EXIT_SESSION:
            return reason or "its peers run another job"
        if code == EXIT_BAD_JOB:
            return reason or "its job or inputs are unusable"
        return reason or f"it exited with code {code}"

    @staticmethod
    def _accused(w: _Worker) -> str | None:
        """The peer a worker names as the sender of a message it could not take."""
        if w.proc.returncode != EXIT_PEER_FAULT:
            return None
        with contextlib.suppress(OSError, ValueError, TypeError, IndexError):
            peer = json.loads((w.directory / "result.json").read_text()).get("peer")
            if isinstance(peer, int) and 0 <= peer < len(PARTY_NAMES) and peer != w.index:
                return PARTY_NAMES[peer]
        return None

    @staticmethod
    def _result_reason(w: _Worker) -> str | None:
        with contextlib.suppress(OSError, ValueError):
            result = json.loads((w.directory / "result.json").read_text())
            return str(result.get("reason", ""))[:200] or None
        return None

    @staticmethod
    def _relay(status: Path, seen: int, progress: Progress | None) -> int:
        if progress is None:
            return seen
        try:
            lines = status.read_text(encoding="utf-8").splitlines()
        except OSError:
            return seen
        for line in lines[seen:]:
            progress(f"mpyc: {line[:80]}")
        return max(seen, len(lines))

    async def _stop(self, workers: list[_Worker]) -> None:
        """Kill whatever still runs (only our own children, by process object)."""
        for w in workers:
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
        for w in workers:
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(w.proc.wait(), KILL_GRACE)
            for t in w.drains:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(t, KILL_GRACE)

    # -- results -----------------------------------------------------------------

    @staticmethod
    def _read_output(path: Path, shape: Step2AShape, party: int) -> np.ndarray:
        name = PARTY_NAMES[party]
        try:
            blob = path.read_bytes()
        except OSError:
            raise EngineError(f"MPyC party {name} produced no output", party=name) from None
        if len(blob) != 8 * shape.outputs:
            raise EngineError("the MPyC output has the wrong length", party=name)
        return np.frombuffer(blob, dtype="<u8").astype(np.uint64)

    @staticmethod
    def _party_stats(w: _Worker) -> PartyStats:
        bytes_sent = 0
        seconds = (w.ended or time.monotonic()) - w.started
        with contextlib.suppress(OSError, ValueError, TypeError):
            result = json.loads((w.directory / "result.json").read_text())
            bytes_sent = int(result.get("bytes_sent", 0))
            seconds = float(result.get("seconds", seconds))
        return PartyStats(w.name, w.proc.returncode, seconds, bytes_sent)


def _status_size(w: _Worker) -> int:
    """The size of a worker's status file (it appends a line per stage it reaches)."""
    try:
        return (w.directory / "status.txt").stat().st_size
    except OSError:
        return 0


def _stalled(workers: list[_Worker], watch: StallWatch, every_party: bool) -> EngineError:
    """The error for a run in which no worker computed or printed for ``watch.limit``."""
    error = _stalled_error(workers, watch, every_party)
    error.waited = watch.idle_seconds(watch.last_at)
    return error


def _stalled_error(workers: list[_Worker], watch: StallWatch,
                   every_party: bool) -> EngineError:
    limit = f"{watch.limit:g} s"
    stopped = sorted(watch.stopped)
    if every_party and stopped:
        names = ", ".join(PARTY_NAMES[i] for i in stopped)
        return StalledError(
            f"the MPyC run made no progress for {limit}: party {names} is stopped (its "
            "worker process is suspended), and the others wait for it; the run stopped",
            party=PARTY_NAMES[stopped[0]],
        )
    if stopped:  # a party daemon whose own worker is suspended: its own failure
        name = workers[0].name
        return EngineError(
            f"the MPyC run made no progress for {limit}: this party's ({name}) worker "
            "process is stopped (suspended); the run stopped",
            party=name,
        )
    who = ("no party computed or printed" if every_party else
           "this party neither computed nor printed, waiting for its peers")
    return StalledError(
        f"the MPyC run made no progress for {limit} ({who}): a peer stopped answering "
        "(its engine frozen, or its connection cut off"
        + ("" if every_party else "; which peer cannot be seen from here")
        + "); the run stopped"
    )
