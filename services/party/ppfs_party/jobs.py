"""Jobs on one party: validation, input assembly, one engine run at a time, records.

A job moves queued -> running -> succeeded | failed | cancelled. Its record is a
JSON file ``<state>/jobs/<job_id>.json`` written atomically at every change; on
start a job found queued or running is marked failed ("party restarted"), never
lost. Each job has a working directory ``<state>/jobs/<job_id>/`` with its
inputs (this party's share components, assembled locally) and the engine's
directory; the opened masked words are kept in ``opened.u64`` until fetched.

Queueing: one engine run at a time per party, in the order jobs were started. The
party's engine listens on its one MPC port (``mpc_port_base``), so runs cannot
overlap; the gateway starts jobs on every party in the same order.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import shutil
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field

import numpy as np

from ppfs.durable import write_durable
from ppfs.engines.base import Engine, PartyRunResult, PartyRunSpec, PartyTls
from ppfs.errors import EngineUnavailableError, ParameterError, PpfsError
from ppfs.jobdesc import description_sha256, train_params
from ppfs.step2a import Security
from ppfs.upload import seal
from ppfs.v1 import party_pb2
from ppfs_party.audit import AuditLog
from ppfs_party.combine import assemble
from ppfs_party.config import PartySettings
from ppfs_party.errors import DescriptionMismatchError, JobConflictError, NotFoundError
from ppfs_party.keys import PartyKeys, fingerprint
from ppfs_party.store import ShareStore, check_id

log = logging.getLogger("ppfs.party")

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued", "running", "succeeded", "failed", "cancelled")
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})

# Fixed engine progress messages -> fraction done (messages never carry data).
_PROGRESS = (
    ("compiling", 0.02), ("preparing", 0.05), ("starting", 0.08), ("running", 0.1),
    ("loading shares", 0.1), ("connecting", 0.12), ("converting shares", 0.15),
    ("mean-split thresholds", 0.2), ("mean-split comparisons", 0.3),
    ("class counts", 0.6), ("long division", 0.65), ("ranking", 0.8), ("selection", 0.9),
    ("opening", 0.95), ("done", 1.0),
)


@dataclass
class JobRecord:
    job_id: str
    description_hex: str  # the serialized JobDescription (public parameters only)
    description_sha256: str
    engine: str
    security: str
    state: str = QUEUED
    phase: str = "queued"
    progress: float = 0.0
    error: str = ""
    program_sha256: str = ""
    seconds: float = 0.0
    bytes_sent: int = 0
    shape: dict[str, int] = field(default_factory=dict)
    mask_upload_id: str = ""
    created_at: str = ""
    updated_at: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def description(self) -> party_pb2.JobDescription:
        return party_pb2.JobDescription.FromString(bytes.fromhex(self.description_hex))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ParameterError("peer MPC addresses must be host:port")
    return host.strip("[]"), int(port)


class JobRunner:
    def __init__(
        self, settings: PartySettings, keys: PartyKeys, store: ShareStore, audit: AuditLog,
        engines: dict[str, Engine],
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.store = store
        self.audit = audit
        self.engines = engines
        self.jobs_dir = settings.state_dir / "jobs"
        self._records: dict[str, JobRecord] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changed: dict[str, asyncio.Condition] = {}
        self._version: dict[str, int] = {}
        self._slot = asyncio.Semaphore(1)  # one engine run at a time
        self._start_lock = asyncio.Lock()

    # -------------------------------------------------------------- records
    def open(self) -> None:
        """Load job records; a job that was queued or running did not survive."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for f in self.jobs_dir.glob(".*.tmp"):
            f.unlink(missing_ok=True)
        for path in sorted(self.jobs_dir.glob("*.json")):
            try:
                rec = JobRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                log.error("[Party.jobs] unreadable job record %s skipped", path.name)
                continue
            if not rec.final:
                rec.state, rec.phase, rec.error = FAILED, "failed", "party restarted"
                self._save(rec)
                self.audit.record("job.failed", job_id=rec.job_id, reason=rec.error)
                self._remove_inputs(rec.job_id)
            self._records[rec.job_id] = rec

    def _save(self, rec: JobRecord) -> None:
        rec.updated_at = _now()
        write_durable(self.jobs_dir / f"{rec.job_id}.json",
                      json.dumps(asdict(rec), indent=1, sort_keys=True).encode())

    def _cond(self, job_id: str) -> asyncio.Condition:
        return self._changed.setdefault(job_id, asyncio.Condition())

    async def _update(self, rec: JobRecord, **changes: object) -> None:
        for k, v in changes.items():
            setattr(rec, k, v)
        await asyncio.to_thread(self._save, rec)
        cond = self._cond(rec.job_id)
        async with cond:
            self._version[rec.job_id] = self._version.get(rec.job_id, 0) + 1
            cond.notify_all()

    def get(self, job_id: str) -> JobRecord:
        rec = self._records.get(job_id)
        if rec is None:
            raise NotFoundError(f"job {job_id!r} is not known to this party")
        return rec

    async def watch(self, job_id: str) -> AsyncIterator[JobRecord]:
        """The job's record now and at every change, until it is final."""
        rec = self.get(job_id)
        cond = self._cond(job_id)
        seen = -1
        while True:
            async with cond:
                while self._version.get(job_id, 0) == seen:
                    await cond.wait()
                seen = self._version.get(job_id, 0)
                snapshot = JobRecord(**asdict(rec))
            yield snapshot  # outside the lock: a slow watcher never holds up the job
            if snapshot.final:
                return

    # -------------------------------------------------------------- start
    async def start(self, desc: party_pb2.JobDescription, sha256: str) -> JobRecord:
        if description_sha256(desc) != sha256:
            raise DescriptionMismatchError(
                "the job description does not match its SHA-256: parties would run different jobs"
            )
        job_id = check_id(desc.job_id, "job id")
        try:
            security = Security(desc.security)
        except ValueError:
            raise ParameterError(f"unknown security setting {desc.security!r}") from None
        engine = self.engines.get(desc.engine)
        if engine is None or not engine.supports(security):
            raise EngineUnavailableError(
                f"this party does not offer {desc.security} on engine {desc.engine!r}"
            )
        index = self.settings.index
        if index >= security.parties:
            raise ParameterError(f"{self.settings.name} takes no part in {security.value}")
        train = train_params(desc)  # ParameterError when out of range
        if len(desc.peer_mpc_addresses) != security.parties:
            raise ParameterError(f"{security.value} needs one MPC address per party")
        peers = tuple(parse_address(a) for a in desc.peer_mpc_addresses)
        if peers[index][1] != self.settings.mpc_port_base:
            raise ParameterError(
                f"{self.settings.name}'s MPC port is {self.settings.mpc_port_base}"
            )
        if len(desc.recipient_public_key) != 32:
            raise ParameterError("the recipient's public key must be a 32-byte X25519 key")
        combination = desc.combination
        if len(desc.dataset_ids) > 1 and combination == party_pb2.COMBINATION_UNSPECIFIED:
            raise ParameterError("several datasets need a combination (horizontal or vertical)")
        async with self._start_lock:
            if job_id in self._records:
                raise JobConflictError(f"job {job_id!r} exists already on this party")
            # Two openings under one mask would reveal the difference of two results.
            if any(r.mask_upload_id == desc.mask_upload_id for r in self._records.values()):
                raise JobConflictError("the mask upload was used by another job: upload new masks")
            job_dir = self.jobs_dir / job_id
            inputs = await asyncio.to_thread(
                assemble, self.store, job_id=job_id, dataset_ids=list(desc.dataset_ids),
                horizontal=combination != party_pb2.COMBINATION_VERTICAL,
                label_column=desc.label_column, mask_upload_id=desc.mask_upload_id,
                k=desc.k, security=security, frac_bits=desc.frac_bits or 16, party=index,
                out_dir=job_dir / "inputs", train=train,
            )
            try:
                digest = await engine.prepare(inputs.shape, security)
            except BaseException:
                shutil.rmtree(job_dir, ignore_errors=True)
                raise
            shape = inputs.shape
            rec = JobRecord(
                job_id=job_id, description_hex=desc.SerializeToString(deterministic=True).hex(),
                description_sha256=sha256, engine=desc.engine, security=security.value,
                program_sha256=digest, created_at=_now(), mask_upload_id=desc.mask_upload_id,
                shape={"m": shape.m, "p": shape.p, "n_classes": shape.n_classes, "k": shape.k,
                       "value_bits": shape.value_bits},
            )
            self._records[job_id] = rec
            self._save(rec)
        self.audit.record(
            "job.accepted", job_id=job_id, engine=desc.engine, security=security.value,
            datasets=list(desc.dataset_ids), combination=party_pb2.Combination.Name(combination),
            mask_upload_id=desc.mask_upload_id, label_column=desc.label_column,
            k=desc.k, frac_bits=desc.frac_bits, shape=rec.shape, program_sha256=digest,
            description_sha256=sha256,
            recipient_key=fingerprint(desc.recipient_public_key),
            peers=list(desc.peer_mpc_addresses),
        )
        spec = PartyRunSpec(
            security=security, shape=shape, party=index, input_dir=job_dir / "inputs",
            workdir=job_dir / "engine", peers=peers,
            tls=PartyTls(self.keys.mpc_key(desc.engine), self.keys.mpc_cert(desc.engine),
                         self.keys.ca_path),
            program_hash=digest, timeout=self.settings.job_timeout,
            bind_host=self.settings.mpc_bind_host,
        )
        self._tasks[job_id] = asyncio.create_task(self._run(rec, engine, spec))
        return rec

    # -------------------------------------------------------------- run
    async def _run(self, rec: JobRecord, engine: Engine, spec: PartyRunSpec) -> None:
        job_id = rec.job_id
        run: asyncio.Task[PartyRunResult] | None = None
        try:
            async with self._slot:
                await self._update(rec, state=RUNNING, phase="starting", progress=0.01)
                log.info("[Party.job] job=%s running", job_id)
                pending: list[str] = []

                def progress(message: str) -> None:
                    pending.append(message)

                run = asyncio.create_task(engine.run_party(spec, progress))
                while not run.done():
                    await asyncio.wait({run}, timeout=0.2)
                    if pending:
                        await self._update(rec, **self._phase(rec, pending[-1]))
                        pending.clear()
                result = run.result()
                await asyncio.to_thread(
                    write_durable, self.jobs_dir / job_id / "opened.u64",
                    np.ascontiguousarray(result.opened, dtype="<u8").tobytes(),
                )
                await self._update(
                    rec, state=SUCCEEDED, phase="done", progress=1.0,
                    seconds=result.seconds, bytes_sent=result.bytes_sent,
                )
                self.audit.record("job.succeeded", job_id=job_id, seconds=result.seconds,
                                  bytes_sent=result.bytes_sent,
                                  program_sha256=result.program_hash)
        except asyncio.CancelledError:
            # stop the engine run (kills its process) and wait for it
            with contextlib.suppress(Exception, asyncio.CancelledError):
                if run is not None and not run.done():
                    run.cancel()
                    await run
            reason = rec.error or "cancelled"
            state = FAILED if reason != "cancelled" else CANCELLED
            await self._update(rec, state=state, phase=state, error=reason
                               if state == FAILED else "")
            self.audit.record(f"job.{state}", job_id=job_id, reason=reason)
        except PpfsError as exc:
            await self._update(rec, state=FAILED, phase="failed", error=str(exc)[:500])
            self.audit.record("job.failed", job_id=job_id, reason=str(exc)[:500])
            log.warning("[Party.job] job=%s failed: %s", job_id, type(exc).__name__)
        except Exception:
            log.exception("[Party.job] job=%s internal error", job_id)
            await self._update(rec, state=FAILED, phase="failed", error="internal error")
            self.audit.record("job.failed", job_id=job_id, reason="internal error")
        finally:
            self._tasks.pop(job_id, None)
            await asyncio.to_thread(self._remove_inputs, job_id)

    @staticmethod
    def _phase(rec: JobRecord, message: str) -> dict[str, object]:
        text = message.removeprefix("mpyc: ")
        frac = rec.progress
        for needle, value in _PROGRESS:
            if needle in text:
                frac = max(frac, value)
        return {"phase": text[:80], "progress": min(frac, 0.99)}

    def _remove_inputs(self, job_id: str) -> None:
        """The job's copies of share components are not kept once it ends."""
        shutil.rmtree(self.jobs_dir / job_id / "inputs", ignore_errors=True)

    # -------------------------------------------------------------- cancel
    async def cancel(self, job_id: str, reason: str = "cancelled") -> JobRecord:
        rec = self.get(job_id)
        task = self._tasks.get(job_id)
        if task is not None and not rec.final:
            if reason != "cancelled":
                rec.error = reason
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return rec

    async def shutdown(self) -> None:
        """Stop every unfinished job (their engine processes are killed)."""
        for job_id in list(self._tasks):
            await self.cancel(job_id, reason="party stopped")

    # -------------------------------------------------------------- results
    def result_part(self, job_id: str) -> tuple[bytes, bytes]:
        """(sealed opened words, Ed25519 signature over job_id || sealed)."""
        rec = self.get(job_id)
        if rec.state != SUCCEEDED:
            raise JobConflictError(f"job {job_id!r} has no result ({rec.state})")
        words = (self.jobs_dir / job_id / "opened.u64").read_bytes()
        recipient = rec.description().recipient_public_key
        sealed = seal(words, recipient)
        signature = self.keys.signing.sign(job_id.encode() + sealed).signature
        self.audit.record(
            "result.released", job_id=job_id,
            what=f"masked outputs, {len(words) // 8} words",
            recipient_key=fingerprint(recipient),
        )
        return sealed, signature

