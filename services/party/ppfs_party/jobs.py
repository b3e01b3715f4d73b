"""Jobs on one party: the cheap checks, then input assembly, compiling and the engine
run (at most ``max_concurrent_jobs`` at a time), with durable records.

A job moves queued -> running -> succeeded | failed | cancelled (ppfs.contract.JobState).
StartJob only checks: the description's hash, the contract (ppfs.contract.JobContract),
this party's part in it (engine, index, its assigned MPC port), the pinned uploads
(ppfs_party.combine.pinned_uploads) and the owners' consents (ppfs.contract.check_consents:
every owner of a pinned upload signed, with its key registered here, a consent naming
the job's recipient and key and what the job reveals, not expired and, for a consent
limited to a number of jobs, with one left here, and for a consent asking for a
minimum of rows, with at least that many pinned of the data set as the manifests held
here count them, and for one asking for a minimum of the owner's own rows, with at
least that many pinned from the uploads whose manifests that owner signed, and for one
naming the security settings it allows, with the job's among them; the mask upload was
signed by that recipient for that key; and no consent it carries is one the job cannot
rely on: another data set, recipient or key, or a security setting it does not allow)
and the recipient's request (ppfs.contract.check_request:
the job's parameters are exactly those the recipient signed). The gateway's own checks
are not relied on. It then
records the job (queued, durably) and answers at once. Compiling the program is the
job's first phase, reported as progress; a compile that finishes after the job was
cancelled still lands in the engine's cache for the next job of the same program. The
inputs are assembled (in memory, handed to the engine as they are) once the job may
run, so that queued jobs hold none.

Up to ``max_concurrent_jobs`` engines run at once (``--max-concurrent-jobs``, default
1); a job beyond that stays queued ("waiting for the engine") until a run ends, and a
cancel stops it there like anywhere else. A job also waits while another job of this
party still holds its MPC port. Every party should allow at least the gateway's
``max_concurrent_jobs``: two parties that start different queued jobs first would
each wait for the other until the engine's connect timeout fails one of them.

Its record is a JSON file ``<state>/jobs/<job_id>.json`` written atomically at every
change; on start a job found queued or running is marked failed (kind "restarted"),
never lost. A cancel for a job this party does not know yet leaves a record in state
cancelled (a tombstone): a later StartJob with that id is refused. Each job has a
working directory ``<state>/jobs/<job_id>/`` with the engine's directory (and the
job's inputs, this party's share components assembled locally, for an engine that
reads them in another process); the opened masked words are kept in ``opened.u64``,
served to every fetch of the result. However a job ends, its inputs and the engine's
copies of share data (ppfs.engines.registry.remove_share_copies) are deleted; the
engine's logs and status stay.

Retention: ``job_retention_days`` (``--job-retention-days``, default 30) after a job
ended (succeeded, failed or cancelled), it is pruned (:meth:`JobRunner.prune`, when the
daemon starts and every hour): its directory, with ``opened.u64`` and the engine's
logs, is deleted, and its record reduced to a tombstone of its id, description hash,
final state, end, mask upload and the limited consents it spent, so that its StartJob
is still refused, its mask upload serves no other job and those consents stay spent.
Its result can be fetched until then; a fetch after says it was pruned. A job not yet
ended is never pruned; nor is a tombstone of a job cancelled before it started (it
holds nothing but its id).

Peers are dialled at the addresses the job lists for them, unless the daemon was
told otherwise (``--mpc-dial``, :class:`ppfs_party.config.MpcDial`: a relay or a NAT
in between); the audit record of an accepted job then names those overrides.

Sessions: each job runs on the MPC port the gateway assigned it from this party's
range, and the engine parties compare a tag derived from the job id and description
hash before any data is input (ppfs.contract.session_tag): a run completes only
together with peers running the same job.

Every accepted or refused StartJob, every cancel request and every end of a job is
written to the audit log.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ppfs.contract import (
    STORED_CONTRACT_VERSIONS,
    ConsentError,
    FailureKind,
    JobContract,
    JobState,
    Plan,
    ResultStatement,
    SignedConsent,
    check_consents,
    check_request,
    description_sha256,
    failure_kind,
    unrelied_consent,
)
from ppfs.contract import seal_result as seal_result_part
from ppfs.durable import write_durable
from ppfs.engines.base import Engine, PartyRunResult, PartyRunSpec, PartyTls, ProgressNote
from ppfs.engines.registry import remove_share_copies
from ppfs.errors import EngineUnavailableError, ParameterError, PpfsError
from ppfs.step2a import Security, Step2AShape
from ppfs.v1 import party_pb2
from ppfs.withdrawal import Revocation, RevocationReceipt, SignedRevocation, WithdrawalError
from ppfs_party.audit import AuditLog
from ppfs_party.combine import PinnedInputsError, assemble, pinned_plan
from ppfs_party.config import PartySettings
from ppfs_party.errors import (
    CorruptStateError,
    DamagedUploadError,
    DescriptionMismatchError,
    JobConflictError,
    NotFoundError,
    PartyStoppingError,
    ResultPrunedError,
    TombstonesFullError,
    is_write_failure,
    storage_error,
    to_status,
)
from ppfs_party.kept import RevocationBook
from ppfs_party.keys import PartyKeys, fingerprint
from ppfs_party.metrics import PartyMetrics
from ppfs_party.store import MAX_TOMBSTONES, ShareStore, StoredUpload, check_job_id

log = logging.getLogger("ppfs.party")

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    JobState.QUEUED.value, JobState.RUNNING.value, JobState.SUCCEEDED.value,
    JobState.FAILED.value, JobState.CANCELLED.value)
FINAL = frozenset(s.value for s in JobState if s.final)

# Fixed engine progress messages -> fraction done (messages never carry data).
_PROGRESS = (
    ("compiling", 0.02), ("preparing", 0.05), ("starting", 0.08), ("running", 0.1),
    ("loading shares", 0.1), ("connecting", 0.12), ("converting shares", 0.15),
    ("mean-split thresholds", 0.2), ("mean-split comparisons", 0.3),
    ("class counts", 0.6), ("long division", 0.65), ("ranking", 0.8), ("selection", 0.9),
    ("opening", 0.95), ("done", 1.0),
)
_RUN_START = 0.1  # "running": where the secure computation's own progress starts


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
    failure: str = ""  # ppfs.contract.FailureKind value when failed or cancelled
    # with a peer_lost or stalled failure: how long the engine had waited (neither
    # computing nor printing) when its run stopped; None: unknown (no stall watch ran)
    waited_seconds: float | None = None
    mpc_port: int = 0
    # columns, column_exponents, classes as verified from the owner-signed manifests
    verified: dict[str, list[object]] = field(default_factory=dict)
    # the limited consents this job spent (SHA-256 of each statement): counted again
    # from the records on every start, so a use outlives a crash with its job
    spent_consents: list[str] = field(default_factory=list)
    created_at: str = ""
    updated_at: str = ""
    # when it became final (the party's clock); "" in a record from before it was kept:
    # then its updated_at, the last change of a final record
    ended_at: str = ""
    # pruned (JobRunner.prune): its directory deleted and its record reduced to what
    # refuses it again (its id, description hash, mask upload and consents spent)
    pruned_at: str = ""
    pruned_after_days: float = 0.0

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def tombstone(self) -> bool:
        """Cancelled before its StartJob arrived: the id may not be started any more."""
        return not self.description_hex and not self.pruned_at

    @property
    def pruned(self) -> bool:
        return bool(self.pruned_at)

    def ended(self) -> float:
        """When a final job ended, Unix seconds."""
        text = self.ended_at or self.updated_at or self.created_at
        return dt.datetime.fromisoformat(text).timestamp()

    def pruned_record(self, at: float, days: float) -> JobRecord:
        """What is kept of this final job once pruned at ``at``: what refuses it again
        (its id, description hash and final state), keeps its mask upload from serving
        another job (two openings under one mask reveal the difference of two results)
        and counts the limited consents it spent; and its public outcome, for GetJob.
        Not its description, its verified columns or anything of its result."""
        return JobRecord(
            job_id=self.job_id, description_hex="",
            description_sha256=self.description_sha256, engine=self.engine,
            security=self.security, state=self.state, phase=self.phase,
            progress=self.progress, error=self.error, program_sha256=self.program_sha256,
            seconds=self.seconds, bytes_sent=self.bytes_sent,
            mask_upload_id=self.mask_upload_id, failure=self.failure, mpc_port=self.mpc_port,
            waited_seconds=self.waited_seconds,
            spent_consents=list(self.spent_consents), created_at=self.created_at,
            ended_at=_iso(self.ended()), pruned_at=_iso(at), pruned_after_days=days,
        )

    def description(self) -> party_pb2.JobDescription:
        return party_pb2.JobDescription.FromString(bytes.fromhex(self.description_hex))


async def finish_despite_cancel(step: Coroutine[Any, Any, None]) -> None:
    """Run ``step`` to its end even if the awaiting task is cancelled meanwhile; the
    cancel is raised once it has ended."""
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")


def _own_rows(job: JobContract, found: list[list[StoredUpload]]) -> dict[tuple[str, str], int]:
    """(owner id, data set id) -> the rows the job pins of the data set from uploads
    whose manifest that owner signed (verified when stored here). An upload holds whole
    rows, so this is each owner's share of the job's rows whatever the combination: in
    a vertical one its rows are joined by columns with the other data sets' rows."""
    own: collections.Counter[tuple[str, str]] = collections.Counter()
    for ds, ups in zip(job.datasets, found, strict=True):
        for u in ups:
            own[u.manifest.owner_id, ds.dataset_id] += u.manifest.rows
    return dict(own)


# a peer's host as the engines take it: a DNS name (compose service names hold '_') or
# an IP address; nothing that could end a line of MP-SPDZ's HOSTS file or an argument
_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})")
_PORT = re.compile(r"[0-9]{1,5}")


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` of a peer's engine (``[v6]:port`` or ``v6:port`` for IPv6);
    ParameterError for anything else."""
    host, sep, port = text.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:  # no IPv6 zone ('%...'): it may hold anything
        is_ip = "%" not in bare and bool(ipaddress.ip_address(bare))
    except ValueError:
        is_ip = False
    if (not sep or not (is_ip or _HOST_NAME.fullmatch(host))
            or not _PORT.fullmatch(port) or not 0 < int(port) < 65536):
        raise ParameterError("peer MPC addresses must be host:port (a DNS name or an IP "
                             "address, a port 1..65535)")
    return bare, int(port)


class JobRunner:
    def __init__(
        self, settings: PartySettings, keys: PartyKeys, store: ShareStore, audit: AuditLog,
        engines: dict[str, Engine], clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        # wall time: when a job ended, and whether it is past its retention (a job's age
        # outlives a restart); tests set it
        self.clock = clock
        self.keys = keys
        self.store = store
        self.audit = audit
        self.engines = engines
        self.jobs_dir = settings.state_dir / "jobs"
        self._records: dict[str, JobRecord] = {}
        self._consent_uses: collections.Counter[str] = collections.Counter()
        self.revocations = RevocationBook(settings.state_dir)  # consents owners revoked
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changed: dict[str, asyncio.Condition] = {}
        self._version: dict[str, int] = {}
        self._slot = asyncio.Semaphore(settings.max_concurrent_jobs)  # engine runs at once
        self._ports: dict[int, asyncio.Lock] = {}  # MPC port -> held by the job using it
        self._start_lock = asyncio.Lock()
        # compiles go on when their job is cancelled: the program is cached for the next
        self._compiles: set[asyncio.Task[str]] = set()
        # one compile per program however many jobs wait for it, and no more compiles at
        # once than engine runs: many jobs started together cost what the party allows
        self._compiling: dict[tuple[str, Step2AShape, Security], asyncio.Task[str]] = {}
        self._compile_slot = asyncio.Semaphore(settings.max_concurrent_jobs)
        self.metrics: PartyMetrics | None = None  # told of every change of a job
        # set when the party stops: no new job is taken while the unfinished ones end
        self.draining = False
        # time.monotonic() by which the unfinished jobs must have ended (drain)
        self._drain_until: float | None = None

    # -------------------------------------------------------------- records
    def open(self) -> None:
        """Load job records; a job that was queued or running did not survive."""
        self.revocations.open()
        self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.jobs_dir.chmod(0o700)  # however it was there: it holds the jobs' shares
        for f in self.jobs_dir.glob(".*.tmp"):
            f.unlink(missing_ok=True)
        for d in self.jobs_dir.glob(".pruned-*"):  # a prune cut short: its record is kept
            shutil.rmtree(d, ignore_errors=True)
        for path in sorted(self.jobs_dir.glob("*.json")):
            try:
                rec = JobRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                # never skipped: a job's record is what refuses a second job on its mask
                # upload and counts the uses of its consents
                reason = (os.strerror(exc.errno).lower() if isinstance(exc, OSError)
                          and exc.errno else "not a job record: truncated or corrupted")
                raise CorruptStateError(
                    f"job record {path} cannot be read ({reason}); the party does not "
                    "start without it (it keeps the job's mask upload from serving another "
                    "job and counts its consent uses): restore it from a backup") from None
            if not rec.final:
                rec.state, rec.phase, rec.error = FAILED, "failed", "party restarted"
                rec.failure = FailureKind.RESTARTED.value
                self._save(rec)
                self.audit.record("job.failed", job_id=rec.job_id, reason=rec.error)
            if rec.pruned:  # its record pruned, its directory perhaps not yet: now
                self._discard_dir(rec.job_id)
            else:
                # every job, not only the unfinished: one may have ended under a version
                # that left the engine's copies behind
                self._remove_share_copies(rec.job_id)
            self._records[rec.job_id] = rec
            self._consent_uses.update(rec.spent_consents)

    def _save(self, rec: JobRecord) -> None:
        rec.updated_at = _now()
        if rec.final and not rec.ended_at:
            rec.ended_at = _iso(self.clock())
        write_durable(self.jobs_dir / f"{rec.job_id}.json",
                      json.dumps(asdict(rec), indent=1, sort_keys=True).encode())

    def _cond(self, job_id: str) -> asyncio.Condition:
        return self._changed.setdefault(job_id, asyncio.Condition())

    async def _update(self, rec: JobRecord, *, keep: bool = True, **changes: object) -> None:
        """Apply ``changes`` and wake the job's watchers; ``keep=False`` for a change of
        phase and progress alone, which is not written to disk (a restarted party reports
        the job failed whatever its progress was; the next kept change writes it all)."""
        old_state = rec.state
        before = {k: getattr(rec, k) for k in changes}
        for k, v in changes.items():
            setattr(rec, k, v)
        if keep:
            try:
                await asyncio.to_thread(self._save, rec)
            except OSError as exc:
                if rec.state not in (FAILED, CANCELLED):
                    # not kept, so not told: the job fails instead (its handler records it)
                    for k, v in before.items():
                        setattr(rec, k, v)
                    raise storage_error(exc, "recording the job's state") from None
                # a failure that cannot be written is still told to every watcher; a
                # restart finds the job unfinished and records it failed then
                log.error("[Party.jobs] job=%s %s not written: %s", rec.job_id, rec.state,
                          storage_error(exc))
        if self.metrics is not None:
            self.metrics.job_changed(rec, old_state)
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
        """Check, record (queued) and schedule the job; refusals are audited."""
        try:
            async with self._start_lock:
                rec, job, engine = self._accept(desc, sha256)
                # no await between recording the job and scheduling it: a cancel that
                # arrives now finds the task
                self._tasks[rec.job_id] = asyncio.create_task(self._run(rec, job, engine))
        except Exception as exc:
            self.audit.record(
                "job.refused", job_id=desc.job_id[:128], description_sha256=sha256[:64],
                reason=to_status(exc)[1], failure=FailureKind.REFUSED.value,
                recipient=desc.recipient[:128],
                recipient_key=fingerprint(desc.recipient_public_key),
            )
            raise
        self.audit.record(
            "job.accepted", job_id=job.job_id, engine=job.engine, security=job.security.value,
            datasets={d.dataset_id: [u.upload_id for u in d.uploads] for d in job.datasets},
            combination=job.combination.value, mask_upload_id=job.mask_upload_id,
            label_column=job.label_column, k=job.k, frac_bits=job.frac_bits,
            shape=rec.shape, description_sha256=sha256, mpc_port=rec.mpc_port,
            recipient=job.recipient, recipient_key=fingerprint(job.recipient_public_key),
            consents=[(c.consent.owner_id, c.consent.dataset_id, c.consent.reveal.value)
                      for c in job.consents],
            consents_spent=rec.spent_consents,
            peers=list(job.peer_mpc_addresses),
            **({"dial": [str(d) for d in self.settings.mpc_dial]}
               if self.settings.mpc_dial else {}),
        )
        log.info("[Party.StartJob] job=%s queued", job.job_id)
        return rec

    def _held_pins(self, job: JobContract) -> list[StoredUpload]:
        """The uploads the job pins, and its mask upload, that this party holds."""
        held = []
        for upload_id in [*(u.upload_id for d in job.datasets for u in d.uploads),
                          job.mask_upload_id]:
            with contextlib.suppress(NotFoundError):
                held.append(self.store.upload(upload_id))
        return held

    def _accept(self, desc: party_pb2.JobDescription, sha256: str
                ) -> tuple[JobRecord, JobContract, Engine]:
        """The cheap checks; records the job as queued. Raises when it is refused."""
        if self.draining:
            raise PartyStoppingError(
                f"{self.settings.name} is stopping: it takes no new job while its running "
                "ones end; submit again once it is back")
        if description_sha256(desc) != sha256:
            raise DescriptionMismatchError(
                "the job description does not match its SHA-256: parties would run different jobs"
            )
        job_id = check_job_id(desc.job_id)
        known = self._records.get(job_id)
        if known is not None:
            if known.tombstone:
                raise JobConflictError(f"job {job_id!r} was cancelled before it reached "
                                       f"{self.settings.name}")
            if known.pruned:
                raise JobConflictError(
                    f"job {job_id!r} ran on {self.settings.name} already ({known.state}; "
                    f"pruned after {known.pruned_after_days:g} days)")
            raise JobConflictError(f"job {job_id!r} exists already on this party")
        self._check_size(desc)
        job = JobContract.from_proto(desc)  # ParameterError when incomplete or inconsistent
        # the record keeps the description as sent: nothing in it that the contract does not
        # state (unknown fields, megabytes of them, would be kept and rewritten with it)
        if job.to_proto().SerializeToString(deterministic=True) != desc.SerializeToString(
                deterministic=True):
            raise ParameterError("the job description holds fields the job contract does "
                                 "not state")
        security = job.security
        engine = self.engines.get(job.engine)
        if engine is None or not engine.supports(security):
            raise EngineUnavailableError(
                f"this party does not offer {security.value} on engine {job.engine!r}"
            )
        index = self.settings.index
        if index >= security.parties:
            raise ParameterError(f"{self.settings.name} takes no part in {security.value}")
        if len(job.peer_mpc_addresses) != security.parties:
            raise ParameterError(f"{security.value} needs one MPC address per party")
        peers = tuple(parse_address(a) for a in job.peer_mpc_addresses)
        self.settings.dial_for(peers)  # a shifted port out of range refuses the job here
        port = peers[index][1]
        base, count = self.settings.mpc_port_base, self.settings.mpc_port_count
        if not base <= port < base + count:
            raise ParameterError(
                f"{self.settings.name}'s MPC ports are {base}..{base + count - 1}, not {port}"
            )
        # names every difference between the pinned and the held uploads
        found, verified = pinned_plan(self.store, job, self.settings.name)
        mask = self.store.upload(job.mask_upload_id)
        if mask.kinds != frozenset({"mask"}):
            raise ParameterError("the mask upload holds no mask words")
        owners = self.store.owners()
        # every consent relayed is one this party can check, and relayed once: consents of
        # owners it does not know would be kept with the job's record unread
        if len(set(job.consents)) != len(job.consents):
            raise ConsentError("the job carries a consent more than once")
        for sc in job.consents:
            if sc.consent.owner_id not in owners:
                raise ConsentError(f"the job carries a consent of {sc.consent.owner_id!r}, "
                                   "no data owner registered with this party")
        upload_owners = {ds.dataset_id: [u.manifest.owner_id for u in ups]
                         for ds, ups in zip(job.datasets, found, strict=True)}
        spent = check_consents(
            job, upload_owners, owners, mask.manifest.owner_id,
            base64.b64decode(mask.manifest.recipient_public_key), self._consent_uses,
            revoked=self.revocations.covers,
            # a consent's minimum of rows against the manifests held here, not the job's word
            rows={ds.dataset_id: sum(u.manifest.rows for u in ups)
                  for ds, ups in zip(job.datasets, found, strict=True)},
            # and its minimum of the owner's own rows: the manifests it signed (each verified
            # against its key when stored here), whatever another owner pins beside them
            own_rows=_own_rows(job, found),
        )
        # and only consents that could serve the job: the gateway holds every consent it
        # was ever given, and the job's record keeps the ones it carries
        unrelied = unrelied_consent(job, upload_owners)
        if unrelied:
            raise ConsentError(unrelied)
        # the parameters are the recipient's, not the gateway's: signed by the recipient
        check_request(job, owners.get(job.recipient))
        # Two openings under one mask would reveal the difference of two results.
        if any(r.mask_upload_id == job.mask_upload_id for r in self._records.values()):
            raise JobConflictError("the mask upload was used by another job: upload new masks")
        shape = job.shape
        rec = JobRecord(
            job_id=job_id, description_hex=desc.SerializeToString(deterministic=True).hex(),
            description_sha256=sha256, engine=job.engine, security=security.value,
            created_at=_now(), mask_upload_id=job.mask_upload_id, mpc_port=port,
            shape={"m": shape.m, "p": shape.p, "n_classes": shape.n_classes, "k": shape.k,
                   "value_bits": shape.value_bits},
            verified={"columns": list(verified.columns),
                      "column_exponents": list(verified.column_exponents),
                      "classes": list(verified.classes)},
            spent_consents=spent,
        )
        self._save(rec)  # durable before it is known, the use counted or the job answered
        self._records[job_id] = rec
        self._consent_uses.update(spent)
        return rec, job, engine

    def _check_size(self, desc: party_pb2.JobDescription) -> None:
        """A job names no more data sets and pins no more uploads than this party holds:
        checked before the description is read any further, and reading at most as many
        pins as are held, so that one the size of a gRPC message (a million pins of one
        upload, or as many data sets) is refused at once."""
        held_datasets, held_uploads = self.store.counts()
        name = self.settings.name
        if len(desc.datasets) > max(held_datasets, 1):
            raise PinnedInputsError(f"the job names {len(desc.datasets)} data sets; {name} "
                                    f"holds {held_datasets}")
        if sum(len(d.uploads) for d in desc.datasets) <= max(held_uploads, 1):
            return
        seen: set[tuple[str, str]] = set()
        for d in desc.datasets:
            for u in d.uploads:
                if (d.dataset_id, u.upload_id) in seen:  # said as the full check says it
                    raise PinnedInputsError(f"the job pins upload {u.upload_id!r} of data set "
                                            f"{d.dataset_id!r} more than once")
                seen.add((d.dataset_id, u.upload_id))
                if len(seen) > held_uploads:  # one of them at least is not held here
                    raise PinnedInputsError(
                        f"the job pins more uploads than the {held_uploads} {name} holds")

    async def _compile(self, engine: Engine, shape: Step2AShape, security: Security) -> str:
        """The program's hash, compiling it if needed. Cancelling the caller does not stop
        the compile: its program is kept in the cache for the next job of this shape.
        Jobs of one program share its compile; at most ``max_concurrent_jobs`` compile
        at once."""
        key = (engine.name, shape, security)
        task = self._compiling.get(key)
        if task is None:
            task = asyncio.create_task(self._compile_in_slot(engine, shape, security))
            self._compiling[key] = task
            self._compiles.add(task)
            task.add_done_callback(self._compiles.discard)
            task.add_done_callback(lambda _: self._compiling.pop(key, None))
        return await asyncio.shield(task)

    async def _compile_in_slot(self, engine: Engine, shape: Step2AShape,
                               security: Security) -> str:
        async with self._compile_slot:
            return await engine.prepare(shape, security)

    # -------------------------------------------------------------- run
    async def _run(self, rec: JobRecord, job: JobContract, engine: Engine) -> None:
        job_id = rec.job_id
        index = self.settings.index
        job_dir = self.jobs_dir / job_id
        run: asyncio.Task[PartyRunResult] | None = None
        try:
            await self._update(rec, phase="compiling", progress=0.01)
            digest = await self._compile(engine, job.shape, job.security)
            await self._update(rec, program_sha256=digest, phase="waiting for the engine",
                               progress=0.02)
            peers = tuple(parse_address(a) for a in job.peer_mpc_addresses)
            port = self._ports.setdefault(rec.mpc_port, asyncio.Lock())
            async with port, self._slot:
                # assembled once a run may start, so that a queue of jobs holds no
                # inputs in memory; the engine takes the bundles as they are
                await self._update(rec, phase="assembling inputs", progress=0.03)
                try:
                    inputs = await asyncio.to_thread(
                        assemble, self.store, job, index, self.settings.name)
                except DamagedUploadError:
                    # damaged since the job was accepted: set aside like any other
                    await self.store.set_aside_damaged(self._held_pins(job))
                    raise
                spec = PartyRunSpec(
                    security=job.security, shape=inputs.shape, party=index,
                    input_dir=job_dir / "inputs", workdir=job_dir / "engine",
                    peers=peers, dial=self.settings.dial_for(peers),
                    tls=PartyTls(self.keys.mpc_key(job.engine),
                                 self.keys.mpc_cert(job.engine), self.keys.ca_path),
                    program_hash=digest, timeout=self.settings.job_timeout,
                    stall_timeout=self.settings.stall_timeout,
                    bind_host=self.settings.mpc_bind_host,
                    session_tag=job.session_tag(rec.description_sha256),
                    bundles=inputs.bundles,
                )
                del inputs
                await self._update(rec, state=RUNNING, phase="starting", progress=0.04)
                log.info("[Party.job] job=%s running", job_id)
                pending: list[str] = []

                def progress(message: str) -> None:
                    pending.append(message)

                run = asyncio.create_task(engine.run_party(spec, progress))
                while True:
                    await asyncio.wait({run}, timeout=0.2)
                    # every message the engine reported counts, up to its end and before
                    # its outcome: a job's record shows how far the run went (a failed
                    # one, where it stopped), not what this loop happened to look at
                    if pending:
                        await self._update(rec, keep=False, **self._phases(rec, pending))
                        pending.clear()
                    if run.done():
                        break
                result = run.result()
                # the run is over: its result is kept even if the party is being stopped
                # meanwhile (a cancel then waits the few milliseconds this takes)
                await finish_despite_cancel(self._succeed(rec, job_dir, result))
        except asyncio.CancelledError:
            if rec.state == SUCCEEDED:  # stopped while its result was being kept: kept
                return
            # stop the engine run (kills its process) and wait for it
            with contextlib.suppress(Exception, asyncio.CancelledError):
                if run is not None and not run.done():
                    run.cancel()
                    await run
            reason = rec.error or "cancelled"
            if reason == "cancelled":
                await self._update(rec, state=CANCELLED, phase=CANCELLED, error="",
                                   failure=FailureKind.CANCELLED.value)
            else:
                await self._update(rec, state=FAILED, phase=FAILED, error=reason,
                                   failure=rec.failure or FailureKind.RESTARTED.value)
            self.audit.record(f"job.{rec.state}", job_id=job_id, reason=reason,
                              failure=rec.failure)
        except PpfsError as exc:
            kind = failure_kind(exc)
            waited = getattr(exc, "waited", None)
            await self._update(rec, state=FAILED, phase="failed", error=str(exc)[:500],
                               failure=kind.value,
                               waited_seconds=(float(waited) if waited is not None and kind in
                                               (FailureKind.PEER_LOST, FailureKind.STALLED)
                                               else None))
            self.audit.record("job.failed", job_id=job_id, reason=str(exc)[:500],
                              failure=kind.value)
            log.warning("[Party.job] job=%s failed: %s (%s)", job_id, type(exc).__name__,
                        kind.value)
        except Exception as exc:
            # a write of the job's files that failed is named (this party's disk full);
            # anything else unexpected is an internal error, its details in the log only
            reason = (str(storage_error(exc, "writing the job's files"))
                      if isinstance(exc, OSError) and is_write_failure(exc) else "internal error")
            log.exception("[Party.job] job=%s %s", job_id, reason)
            await self._update(rec, state=FAILED, phase="failed", error=reason,
                               failure=FailureKind.OWN.value)
            self.audit.record("job.failed", job_id=job_id, reason=reason,
                              failure=FailureKind.OWN.value)
        finally:
            self._tasks.pop(job_id, None)
            await asyncio.to_thread(self._remove_share_copies, job_id)

    async def _succeed(self, rec: JobRecord, job_dir: Path, result: PartyRunResult) -> None:
        """Keep a finished run's opened words and record the job succeeded."""
        try:
            await asyncio.to_thread(
                write_durable, job_dir / "opened.u64",
                np.ascontiguousarray(result.opened, dtype="<u8").tobytes(),
            )
        except OSError as exc:  # no result is served from a file not wholly kept
            raise storage_error(exc, "keeping the job's result") from None
        await self._update(
            rec, state=SUCCEEDED, phase="done", progress=1.0,
            seconds=result.seconds, bytes_sent=result.bytes_sent,
        )
        self.audit.record("job.succeeded", job_id=rec.job_id, seconds=result.seconds,
                          bytes_sent=result.bytes_sent, program_sha256=result.program_hash)

    @staticmethod
    def _phase(rec: JobRecord, message: str) -> dict[str, object]:
        text = message.removeprefix("mpyc: ")
        frac = rec.progress
        if isinstance(message, ProgressNote):
            # the engine says how far its run is: that run spans 10 % to 99 % here
            frac = max(frac, _RUN_START + (0.99 - _RUN_START) * message.fraction)
        else:
            for needle, value in _PROGRESS:
                if needle in text:
                    frac = max(frac, value)
        return {"phase": text[:80], "progress": min(frac, 0.99)}

    @classmethod
    def _phases(cls, rec: JobRecord, messages: list[str]) -> dict[str, object]:
        """:meth:`_phase` after all of ``messages`` in turn: the last one's phase, the
        furthest progress of any."""
        changes = cls._phase(rec, messages[-1])
        changes["progress"] = max(float(cls._phase(rec, m)["progress"])  # type: ignore[arg-type]
                                  for m in messages)
        return changes

    def _remove_share_copies(self, job_id: str) -> None:
        """The job's copies of share components are not kept once it ends: its inputs,
        and what the engine's run left of them in its directory (its logs stay)."""
        job_dir = self.jobs_dir / job_id
        shutil.rmtree(job_dir / "inputs", ignore_errors=True)
        remove_share_copies(job_dir / "engine")

    # -------------------------------------------------------------- cancel
    async def cancel(self, job_id: str, reason: str = "cancelled",
                     failure: FailureKind = FailureKind.RESTARTED) -> tuple[JobRecord, bool]:
        """Stop the job (its engine process is killed). A job not known yet is recorded
        as cancelled, so its StartJob is refused when it arrives; returns (record,
        whether it was such a tombstone). With a ``reason`` other than "cancelled" the
        job fails with it, as a failure of kind ``failure``."""
        job_id = check_job_id(job_id)
        async with self._start_lock:  # a start in progress completes first
            rec = self._records.get(job_id)
            if rec is None:
                if sum(r.tombstone for r in self._records.values()) >= MAX_TOMBSTONES:
                    raise TombstonesFullError(
                        f"this party keeps at most {MAX_TOMBSTONES} jobs cancelled before "
                        "they started; a cancel of a job it never received is refused")
                rec = JobRecord(
                    job_id=job_id, description_hex="", description_sha256="", engine="",
                    security="", state=CANCELLED, phase="cancelled before it started",
                    failure=FailureKind.CANCELLED.value, created_at=_now(),
                )
                self._save(rec)
                self._records[job_id] = rec
                self.audit.record("job.cancel", job_id=job_id, reason=reason,
                                  outcome="remembered before start")
                return rec, True
            self.audit.record("job.cancel", job_id=job_id, reason=reason,
                              outcome="already " + rec.state if rec.final else "stopping")
        task = self._tasks.get(job_id)
        if task is not None and not rec.final:
            if reason != "cancelled":
                rec.error, rec.failure = reason, failure.value
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return rec, False

    async def stop_using(self, upload_ids: Iterable[str], reason: str) -> list[str]:
        """Cancel every unfinished job that pins one of ``upload_ids`` (withdrawn by
        their owner); the ids of the jobs stopped."""
        gone = set(upload_ids)
        return await self._refuse_unfinished(
            lambda desc: any(u.upload_id in gone for d in desc.datasets for u in d.uploads),
            reason)

    async def _refuse_unfinished(self, relies: Callable[[party_pb2.JobDescription], bool],
                                 reason: str) -> list[str]:
        """Stop every unfinished job whose description ``relies`` on what this party no
        longer accepts (it fails with ``reason``, refused here); their ids."""
        stopped = []
        for rec in list(self._records.values()):
            if not (rec.final or rec.tombstone) and relies(rec.description()):
                await self.cancel(rec.job_id, reason=reason, failure=FailureKind.REFUSED)
                stopped.append(rec.job_id)
        return stopped

    async def revoke(self, signed: SignedRevocation) -> RevocationReceipt:
        """Keep an owner's revocation of its consents, checked here against the owner's
        key in this party's own registry, and stop the unfinished jobs that rely on a
        consent it covers; the receipt (unsigned). WithdrawalError if not carried out."""
        asked = Revocation.from_bytes(signed.statement)
        key = self.store.owners().get(asked.owner_id)
        if key is None:
            raise WithdrawalError(f"owner {asked.owner_id!r} is not registered at this party")
        r = signed.verify(key)
        async with self._start_lock:  # no job is accepted on a consent while it is kept
            await asyncio.to_thread(self.revocations.keep, signed.digest, signed.statement,
                                    signed.signature, r)
        stopped = await self._refuse_unfinished(
            lambda desc: any(r.covers(SignedConsent(c.statement, c.signature).consent)
                             for c in desc.consents),
            "a consent it relies on was revoked by its owner")
        self.audit.record("consent.revoked", dataset_id=r.dataset_id, owner_id=r.owner_id,
                          recipient=r.recipient, jobs_stopped=len(stopped),
                          revocation_sha256=signed.digest)
        return RevocationReceipt(signed.digest, self.settings.index, r.owner_id,
                                 r.dataset_id, r.recipient, len(stopped))

    def unfinished(self) -> int:
        """How many jobs this party accepted have not ended (queued or running)."""
        return sum(1 for r in self._records.values() if not (r.final or r.tombstone))

    def stop_seconds_left(self) -> int:
        """While the party stops: the whole seconds its unfinished jobs have left to end
        (0 once it stops them, or when it was stopped without a drain)."""
        if self._drain_until is None:
            return 0
        return max(0, math.ceil(self._drain_until - time.monotonic()))

    async def drain(self, seconds: float, stop_now: asyncio.Event) -> int:
        """Take no new job and wait until every unfinished one has ended, ``seconds``
        have passed or ``stop_now`` is set; how many are left unfinished."""
        self.draining = True
        self._drain_until = time.monotonic() + seconds
        try:
            while self.unfinished() and not stop_now.is_set():
                left = self._drain_until - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_now.wait(), min(0.2, left))
        finally:
            self._drain_until = time.monotonic()  # what is left is stopped now
        return self.unfinished()

    async def shutdown(self) -> None:
        """Stop every unfinished job (their engine processes are killed), taking no
        new one meanwhile (one accepted now would outlive the stop)."""
        self.draining = True
        for job_id in list(self._tasks):
            await self.cancel(job_id, reason="party stopped")

    # -------------------------------------------------------------- retention
    def _pruned_message(self, rec: JobRecord) -> str:
        return (f"the result of job {rec.job_id!r} was pruned after "
                f"{rec.pruned_after_days:g} days at {self.settings.name} (on "
                f"{rec.pruned_at[:10]}; its jobs' files are kept that long after they "
                "end): run the job again")

    async def prune(self) -> list[str]:
        """Prune every job that ended more than ``job_retention_days`` ago: its directory
        (the engine's logs and status, the opened masked words of its result) is
        deleted and its record reduced to :meth:`JobRecord.pruned_record`, written
        first, so that whatever the crash point the job stays refused (a directory
        left is deleted on the next start). A job not yet final, or still ending, is
        never pruned, nor a tombstone of a job cancelled before it started (it holds
        nothing). Audited (``job.pruned``); the ids pruned."""
        days = self.settings.job_retention_days
        now = self.clock()
        horizon = now - self.settings.job_retention
        pruned = []
        for rec in list(self._records.values()):
            if not rec.final or rec.tombstone or rec.pruned or rec.job_id in self._tasks:
                continue
            try:
                if rec.ended() > horizon:
                    continue
            except ValueError:  # a record edited by hand: kept, never taken as old
                log.warning("[Party.jobs] job=%s: its record names no time it ended; "
                            "not pruned", rec.job_id)
                continue
            kept = rec.pruned_record(now, days)
            try:
                await asyncio.to_thread(self._save, kept)
            except OSError as exc:  # kept whole: the next round tries again
                log.error("[Party.jobs] job=%s not pruned: %s", rec.job_id,
                          storage_error(exc))
                continue
            # no result is served from here on (result_part runs on this loop)
            self._records[rec.job_id] = kept
            await asyncio.to_thread(self._discard_dir, rec.job_id)
            self.audit.record("job.pruned", job_id=rec.job_id, state=rec.state,
                              ended_at=kept.ended_at, retention_days=days,
                              description_sha256=rec.description_sha256)
            log.info("[Party.jobs] job=%s pruned (%s, ended %s)", rec.job_id, rec.state,
                     kept.ended_at)
            pruned.append(rec.job_id)
        return pruned

    def _discard_dir(self, job_id: str) -> None:
        """Delete the job's directory: renamed to a dot-name first (cleared on start), so
        a deletion cut short never leaves part of it under the job's id."""
        job_dir = self.jobs_dir / job_id
        doomed = self.jobs_dir / f".pruned-{uuid.uuid4().hex}"
        try:
            job_dir.rename(doomed)
        except FileNotFoundError:
            return
        except OSError:
            doomed = job_dir
        shutil.rmtree(doomed, ignore_errors=True)

    # -------------------------------------------------------------- results
    def result_part(self, job_id: str) -> tuple[bytes, bytes, bytes, bytes]:
        """(sealed opened words, Ed25519 signature over job_id || sealed, this party's
        result statement (ppfs.contract.ResultStatement), its signature)."""
        rec = self.get(job_id)
        if rec.state != SUCCEEDED:
            raise JobConflictError(f"job {job_id!r} has no result ({rec.state})")
        if rec.pruned:
            raise ResultPrunedError(self._pruned_message(rec))
        if not rec.verified:
            raise JobConflictError(f"job {job_id!r} predates signed result statements")
        try:
            words = (self.jobs_dir / job_id / "opened.u64").read_bytes()
        except FileNotFoundError:  # deleted by hand, or a restore without it
            raise NotFoundError(f"the result of job {job_id!r} is missing at "
                                f"{self.settings.name} (its file is gone): run the job "
                                "again") from None
        # accepted when it was recorded, perhaps under the contract before an upgrade
        job = JobContract.from_proto(rec.description(), versions=STORED_CONTRACT_VERSIONS)
        recipient = job.recipient_public_key
        sealed, signature = seal_result_part(
            job_id, np.frombuffer(words, dtype="<u8"), recipient, self.keys.signing)
        v = rec.verified
        verified = Plan(
            m=job.m, p=job.p, columns=tuple(str(c) for c in v["columns"]),
            column_exponents=tuple(int(str(e)) for e in v["column_exponents"]),
            classes=tuple(str(c) for c in v["classes"]), frac_bits=job.frac_bits,
            labelled=())
        statement, statement_sig = ResultStatement.for_job(
            job, rec.description_sha256, self.settings.index, sealed, verified,
        ).sign(self.keys.signing)
        self.audit.record(
            "result.released", job_id=job_id,
            what=f"masked outputs, {len(words) // 8} words",
            recipient_key=fingerprint(recipient),
        )
        return sealed, signature, statement, statement_sig

