"""Jobs: checked and planned into one job contract (ppfs.contract.JobContract) that
pins every input, started on every party with the same description and its SHA-256,
then watched.

A job moves queued -> running -> succeeded | failed | cancelled and never leaves a
final state. It fails naming the party whose own state failed, that refused to
start it, or that could not be reached for ``party_lost_seconds``; who is blamed
follows from the failure kind each party reports (ppfs.contract.FailureKind).

Up to ``max_concurrent_jobs`` jobs run side by side, started in submission order (a job
never overtakes an earlier one). When a job starts it is given one MPC port per party
from that party's free ports (:class:`PortBook`), and its description is pinned with
them; two unfinished jobs never share a port on any party. A job's ports are freed only
once every party has reported it final (cancelled, failed or succeeded): a straggling
engine of a failed or cancelled job never meets a later job's engine on its port. The
free port after the last one handed out is taken first, so consecutive jobs rotate over
a party's range as before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ppfs.contract import (
    Combination,
    Consent,
    ConsentError,
    DatasetSchema,
    FailureKind,
    JobContract,
    JobState,
    PinnedDataset,
    PinnedUpload,
    Reveal,
    SignedConsent,
    SignedRequest,
    description_sha256,
    parse_scorer,
    plan,
    training_from_body,
)
from ppfs.contract import IncompatibleDatasets as _Incompatible
from ppfs.engines.stall import SAMPLE_SECONDS
from ppfs.errors import ParameterError
from ppfs.jobflags import ENGINE_SECURITIES
from ppfs.step2a import Security, Step2AShape
from ppfs.v1 import party_pb2 as pb
from ppfs_gateway.auth import Principal
from ppfs_gateway.core.config import Role
from ppfs_gateway.errors import (
    Conflict,
    Forbidden,
    GatewayError,
    GatewayStorageError,
    IncompatibleSchemas,
    InvalidRequest,
    NotFound,
    PartyRefusesConnections,
    PartyStopping,
    no_job_created,
)
from ppfs_gateway.parties import Parties, PartyClient
from ppfs_gateway.registry import FINAL_STATES, JobRecord, PartyJobState, Registry
from ppfs_gateway.uploads import UploadKeeper, check_path_id, new_id, visible_dataset

log = logging.getLogger("ppfs.gateway")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")

@dataclass(frozen=True)
class JobSpec:
    dataset_ids: tuple[str, ...]
    combination: str
    label_column: str
    k: int
    security: str
    engine: str
    recipient_public_key: bytes
    mask_upload_id: str
    training: dict[str, Any] | None = None
    scorer: str = "ms-gini"
    request: SignedRequest | None = None  # the recipient's; relayed, checked by the parties


@dataclass(frozen=True)
class JobPlan:
    description: pb.JobDescription
    sha256: str
    shape: Step2AShape
    columns: tuple[str, ...]
    column_exponents: tuple[int, ...]
    classes: tuple[str, ...]


# How long a "a peer went away" failure waits for its cause to show before the reporter
# is named; well inside the 60 s in which a job must fail when a party dies.
BLAME_SECONDS = 10.0
# A cancel is sent until the party acknowledges it, at most this often.
CANCEL_ATTEMPTS = 5
# A submission refused because a party is stopping says Retry-After: the seconds its
# unfinished jobs have left (it has stopped by then; when it is back is its operator's
# doing), and never less than this
STOPPING_RETRY_AFTER = 30


def _symptom(st: pb.JobStatus) -> bool:
    kind = FailureKind.from_proto(st.failure)
    return kind is not None and kind.symptom


def _stalled(st: pb.JobStatus) -> bool:
    """A run that made no progress: its reporter waited on a peer it cannot name, and the
    peer whose engine stopped may report that as its own failure a few seconds later."""
    return FailureKind.from_proto(st.failure) is FailureKind.STALLED


# A stall report is refuted only by waits this far below half the reporter's claimed
# idle time: each party's watch samples every SAMPLE_SECONDS, so an idle time it reports
# may fall short of the true one by a sample, and its run ends up to a sample after the
# last one it took.
REFUTE_SLACK = 2 * SAMPLE_SECONDS


def refuted_stall(statuses: Mapping[str, pb.JobStatus],
                  floor: float = 0.0) -> tuple[str, float | None, float] | None:
    """(party, idle time it claims (None: it claims none), longest wait of the others)
    when exactly one party reported its run STALLED and every other party refutes it;
    else None.

    An honest stall reporter waited ``claimed`` seconds (at least its stall limit) on a
    peer that stopped answering; the peers it left waiting went idle at most one
    computation step after it did, so when its engine stopped they lost it having
    waited about as long. A party that instead stops its own engine while the others
    compute, then reports a stall, leaves them having waited a few seconds at most. The
    report is refuted when every other party lost a peer (PEER_LOST) with a known wait
    (``waited_seconds``) under ``max(claimed, floor) / 2 - REFUTE_SLACK``; sound while
    the longest step one party computes as the others wait stays under a quarter of the
    stall limit (far below it: :data:`ppfs.engines.stall.DEFAULT_STALL_SECONDS`). A wait
    not reported (a party without a stall watch, or older) or long, a party that did not
    lose a peer, or a second stall report backs the stall: a single corrupted party
    cannot get an honest stall reporter named, as an honest party left waiting reports a
    long wait whatever the corrupted one says. Never with fewer than three parties (the
    only other party's word would decide).

    ``claimed`` is the reporter's own word, and so is its stall limit: a party that
    kills its engine and claims a short stall (or none) would leave nothing to refute.
    ``floor`` (the gateway's ``stall_floor_seconds``) is the smallest stall limit any
    party of the deployment uses, so a claim below it, or none, is taken as the floor:
    an honest party never stalls sooner. This assumes that every party's
    ``--stall-timeout`` is 0 (no stall watch: it never reports a stall) or at least the
    floor; a party configured below it can be named for an honest stall, which is a
    misconfiguration of the deployment. ``floor`` 0: a claim is taken at its word, and
    one of unknown length is never refuted."""
    stalls = [name for name, st in statuses.items()
              if st.state == pb.JOB_STATE_FAILED and _stalled(st)]
    if len(statuses) < 3 or len(stalls) != 1:
        return None
    party = stalls[0]
    report = statuses[party]
    claimed: float | None = report.waited_seconds
    if not report.HasField("waited_seconds") or math.isnan(report.waited_seconds):
        claimed = None  # (a NaN would compare as no length at all)
    if claimed is None and floor <= 0:
        return None
    bound = max(claimed or 0.0, floor) / 2 - REFUTE_SLACK
    waits = []
    for name, st in statuses.items():
        if name == party:
            continue
        if (st.state != pb.JOB_STATE_FAILED
                or FailureKind.from_proto(st.failure) is not FailureKind.PEER_LOST
                or not st.HasField("waited_seconds") or not st.waited_seconds < bound):
            return None
        waits.append(st.waited_seconds)
    return party, claimed, max(waits)


def refuted_reason(party: str, claimed: float | None, longest: float,
                   floor: float = 0.0) -> str:
    if claimed is None:
        said = (f"it reported its run stalled, which no party does before {floor:.0f} s "
                f"without progress")
    elif claimed < floor:
        said = (f"it reported its run stalled after {claimed:.0f} s without progress, "
                f"which no party does before {floor:.0f} s")
    else:
        said = f"it reported its run stalled after {claimed:.0f} s without progress"
    return (f"{party} failed: {said}, yet every other party lost its engine having waited "
            f"at most {longest:.0f} s (its engine stopped while they computed)")


def failure_reason(party: str, st: pb.JobStatus) -> str:
    """The job's reason when ``party`` reports a failure: the party is named as the one
    that failed, except for a collective kind, which names it only as the reporter."""
    error = st.error[:300] or "no reason given"
    kind = FailureKind.from_proto(st.failure)
    if kind is not None and kind.collective:
        return f"the secure run stopped: {error} (reported by {party}; no party is blamed)"
    return f"{party} failed: {error}"


def mpc_port(ident: pb.PartyIdentity, sequence: int) -> int:
    """The party's MPC port for the job with this sequence number (rotating)."""
    return ident.mpc_port_base + sequence % max(1, ident.mpc_port_count)


class PortBook:
    """Which MPC port of each party every unfinished job holds (pure bookkeeping).

    A job takes one port per party, each free at that party; it gives them back with
    :meth:`release` once every party has reported it final."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, ...]] = {}
        self._last: dict[int, int] = {}  # party index -> the port it handed out last

    def holders(self) -> dict[str, tuple[int, ...]]:
        return dict(self._held)

    def busy(self, party: int) -> set[int]:
        return {ports[party] for ports in self._held.values()}

    def take(
        self, job_id: str, ranges: Sequence[tuple[int, int]], prefer: Sequence[int] = (),
    ) -> tuple[int, ...] | None:
        """One free port per party ((base, count) each), or None while some party has
        none free: the ports ``prefer`` names when each is in range and free, else the
        free port after the party's last one (rotation)."""
        if job_id in self._held:
            return self._held[job_id]
        if len(prefer) == len(ranges) and all(
            base <= port < base + count and port not in self.busy(i)
            for i, (port, (base, count)) in enumerate(zip(prefer, ranges, strict=True))
        ):
            self.hold(job_id, prefer)
            return self._held[job_id]
        chosen = []
        for i, (base, count) in enumerate(ranges):
            busy = self.busy(i)
            start = (self._last.get(i, base - 1) - base + 1) % max(1, count)
            free = [base + (start + j) % count for j in range(count)
                    if base + (start + j) % count not in busy]
            if not free:
                return None
            chosen.append(free[0])
        for i, port in enumerate(chosen):
            self._last[i] = port
        self._held[job_id] = tuple(chosen)
        return self._held[job_id]

    def hold(self, job_id: str, ports: Sequence[int]) -> None:
        """Record ports a job already holds (a running job found after a restart)."""
        self._held[job_id] = tuple(ports)
        for i, port in enumerate(ports):
            self._last[i] = port

    def release(self, job_id: str) -> None:
        self._held.pop(job_id, None)


def pin_ports(desc: pb.JobDescription, identities: Sequence[pb.PartyIdentity],
              ports: Sequence[int]) -> tuple[pb.JobDescription, str]:
    """The description with these MPC ports (one per party), and its SHA-256."""
    pinned = pb.JobDescription()
    pinned.CopyFrom(desc)
    del pinned.peer_mpc_addresses[:]
    pinned.peer_mpc_addresses.extend(
        f"{i.mpc_host}:{p}" for i, p in zip(identities, ports, strict=True))
    return pinned, description_sha256(pinned)


def described_ports(desc: pb.JobDescription) -> tuple[int, ...]:
    return tuple(int(a.rpartition(":")[2]) for a in desc.peer_mpc_addresses)


def plan_job(
    registry: Registry,
    who: Principal,
    spec: JobSpec,
    identities: list[pb.PartyIdentity],
    job_id: str,
    sequence: int = 0,
    validate_only: bool = False,
) -> JobPlan:
    """Every check a job needs before anything is stored or sent (pure but for reads)."""
    try:
        security = Security(spec.security)
    except ValueError:
        raise InvalidRequest(
            f"unknown security setting {spec.security!r}; "
            f"choose one of {', '.join(s.value for s in Security)}"
        ) from None
    if security.parties != len(identities):
        fitting = [s.value for s in Security if s.parties == len(identities)]
        hint = f": choose {' or '.join(fitting)} (--security)" if fitting else ""
        raise InvalidRequest(
            f"security: {security.value} needs {security.parties} parties; "
            f"this deployment has {len(identities)}{hint}"
        )
    runs = ENGINE_SECURITIES.get(spec.engine)
    if runs is None:
        raise InvalidRequest(f"engine: unknown engine {spec.engine!r}")
    if security.value not in runs:
        raise InvalidRequest(
            f"engine/security: {spec.engine} does not run {security.value}; "
            f"it runs {', '.join(runs)}"
        )
    for ident in identities:
        if spec.engine not in ident.engines:
            raise InvalidRequest(f"engine: {ident.name} does not offer the engine {spec.engine!r}")
    combination = Combination.parse(spec.combination)
    if not spec.dataset_ids:
        raise InvalidRequest("name at least one data set")
    if len(set(spec.dataset_ids)) != len(spec.dataset_ids):
        raise InvalidRequest("a data set is named twice")
    if len(spec.recipient_public_key) != 32:
        raise InvalidRequest("recipient_public_key must be a 32-byte X25519 public key")
    datasets = [visible_dataset(registry, d, who) for d in spec.dataset_ids]
    schemas = []
    pinned = []
    for ds in datasets:
        if ds.kind != "data":
            raise NotFound(f"no data set {ds.id!r}")
        if ds.schema is None:
            raise Conflict(f"data set {ds.id!r} has no upload yet")
        s = ds.schema
        schemas.append(DatasetSchema(ds.id, s.columns, s.column_exponents, s.label_column,
                                     s.classes, s.frac_bits, ds.rows))
        pinned.append(PinnedDataset(ds.id, tuple(
            PinnedUpload(u, digest, rows) for u, digest, rows in registry.upload_pins(ds.id))))
    try:
        planned = plan(schemas, combination, spec.label_column)
    except _Incompatible as exc:
        raise IncompatibleSchemas(str(exc)) from None
    except ParameterError as exc:
        raise InvalidRequest(str(exc)) from None
    found = registry.find_upload(spec.mask_upload_id) if not validate_only else None
    mask = registry.get_dataset(found[0]) if found else None
    if not validate_only and (
        found is None or mask is None or mask.kind != "mask" or mask.owner_id != who.subject
    ):
        raise NotFound(f"no mask upload {spec.mask_upload_id!r} of yours")
    # The owners' consents for this recipient and key, as stored: the gateway relays every
    # one that covers the job (an owner may have given one for the selection and one for
    # the model, one of them expired), every party verifies them (signature, owner,
    # recipient, key, what is revealed, the security setting, expiry) and needs one valid
    # per owner. A consent that does not allow the job's security setting is not relayed:
    # a party refuses a job carrying one, as one the job cannot rely on.
    training = training_from_body(spec.training)
    consents = []
    for ds in datasets:
        owners = set(registry.upload_owners(ds.id))
        other_settings: dict[str, set[Security]] = {}  # owner -> settings its consents allow
        allowing: set[str] = set()
        for c in registry.consents(ds.id):
            if (c.owner_id in owners and c.recipient == who.subject
                    and c.recipient_key == _b64(spec.recipient_public_key)
                    and Reveal(c.reveal).covers(training is not None)):
                try:
                    stated = Consent.from_bytes(c.statement)
                except ConsentError:
                    continue  # stored before this version could read it: no party will
                if stated.allows(security):
                    allowing.add(c.owner_id)
                    consents.append(SignedConsent(c.statement, c.signature))
                else:
                    other_settings.setdefault(c.owner_id, set()).update(stated.securities)
        # an owner whose every consent for the job names other settings: every party would
        # refuse the job, so say so now (the parties check it themselves all the same)
        for owner in sorted(set(other_settings) - allowing):
            allowed = sorted(s.value for s in other_settings[owner])
            raise InvalidRequest(
                f"security: the consent of {owner!r} for data set {ds.id!r} does not allow "
                f"{security.value}; it allows {', '.join(allowed)} (--security)")
    # ParameterError on a bad shape or parameters; D' is never opened in service mode
    job = JobContract(
        job_id=job_id, datasets=tuple(pinned), combination=combination,
        label_column=spec.label_column, k=spec.k, security=security, engine=spec.engine,
        frac_bits=planned.frac_bits, recipient_public_key=spec.recipient_public_key,
        mask_upload_id=spec.mask_upload_id, m=planned.m, p=planned.p,
        classes=len(planned.classes), training=training,
        scorer=parse_scorer(spec.scorer),
        peer_mpc_addresses=tuple(f"{i.mpc_host}:{mpc_port(i, sequence)}" for i in identities),
        consents=tuple(consents), recipient=who.subject, request=spec.request,
    )
    shape = job.shape
    if found is not None and found[2] != shape.outputs:
        raise InvalidRequest(
            f"the mask upload holds {found[2]} mask words; this job opens {shape.outputs} "
            f"(k = {shape.k} selected indices{' and the model' if job.training else ''})"
        )
    desc = job.to_proto()
    return JobPlan(desc, description_sha256(desc), shape, planned.columns,
                   planned.column_exponents, planned.classes)


class JobCoordinator:
    """Starts jobs on every party and keeps the registry in step with them."""

    def __init__(
        self, registry: Registry, parties: Parties, lost_seconds: float,
        max_concurrent: int = 1, rpc_seconds: float = 5.0, stall_floor: float = 0.0,
    ) -> None:
        self.registry = registry
        self.parties = parties
        self.lost_seconds = lost_seconds
        # the smallest stall limit of any party (stall_floor_seconds): a stall reported
        # after less is taken as this long (refuted_stall); 0: none
        self.stall_floor = stall_floor
        # A lost party is declared failed at most lost_seconds after it went away: the
        # last good poll is <= poll_seconds old when it dies, the next poll may hang for
        # rpc_seconds, so the silence allowed is what is left of the budget. A poll, like
        # every call a party answers at once, waits at most ``rpc_seconds``
        # (party_rpc_seconds).
        self.poll_seconds = max(0.2, min(5.0, lost_seconds / 6))
        self.rpc_seconds = min(rpc_seconds, lost_seconds / 4)
        self.silence_seconds = lost_seconds - self.poll_seconds - self.rpc_seconds
        # A party whose address refuses connections has no daemon running: its job is
        # lost (a restarted party fails its unfinished jobs), so the wait is shorter,
        # long enough for a port that is briefly closed to open again.
        self.refused_seconds = min(self.silence_seconds, max(3 * self.poll_seconds, 5.0))
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        # scheduling: at most max_concurrent jobs running, started in submission order
        self.max_concurrent = max(1, max_concurrent)
        self._waiting: deque[str] = deque()  # jobs not started yet, in submission order
        self._running: set[str] = set()
        self.ports = PortBook()
        self._wake = asyncio.Event()  # set (and replaced) at every change that may admit
        # all-or-nothing uploads: their commit/abort decisions, checks and repairs
        self.uploads = UploadKeeper(registry, parties, rpc_seconds=self.rpc_seconds)
        # told of every change of a job (metrics); must not raise or block
        self.on_change: Callable[[JobRecord], None] | None = None

    # -- submission --------------------------------------------------------------

    async def validate(self, who: Principal, spec: JobSpec) -> JobPlan:
        """Every check of :meth:`submit` but the mask upload's, storing nothing: a client
        validates before it uploads masks, so a refused job leaves no masks behind."""
        if who.role not in (Role.ANALYST, Role.DATA_OWNER, Role.ADMIN):
            raise Forbidden("this role cannot submit jobs")
        identities = await self.parties.identities()
        await self.uploads.learn_signed_times(list(spec.dataset_ids))
        try:
            plan = plan_job(self.registry, who, spec, identities, "validate", validate_only=True)
        except ParameterError as exc:
            raise InvalidRequest(str(exc)) from None
        await self._require_ready(list(spec.dataset_ids))
        return plan

    async def submit(self, who: Principal, spec: JobSpec) -> JobRecord:
        """Record the job and start it. Whatever is raised before the job's row is
        committed says so (:func:`no_job_created`): a client that signed the request then
        knows that no job answers it, also when the refusal is a 5xx (a party that did not
        answer or failed, 502; the gateway's disk, 507)."""
        try:
            job_id = await self._record(who, spec)
        except Exception as exc:
            no_job_created(exc)
            raise
        log.info(
            "[Gateway.SubmitJob] job=%s datasets=%d k=%d", job_id, len(spec.dataset_ids), spec.k
        )
        self._spawn(job_id, resume=False)
        job = self.registry.get_job(job_id)
        assert job is not None
        if self.on_change is not None:
            self.on_change(job)
        return job

    async def _record(self, who: Principal, spec: JobSpec) -> str:
        """Every check of a submission, then the job's row (one transaction): its id."""
        if who.role not in (Role.ANALYST, Role.DATA_OWNER, Role.ADMIN):
            raise Forbidden("this role cannot submit jobs")
        identities = await self.parties.identities()
        await self.uploads.learn_signed_times(list(spec.dataset_ids))
        job_id = new_id()
        try:
            plan = plan_job(self.registry, who, spec, identities, job_id,
                            sequence=self.registry.count_jobs())
        except ParameterError as exc:
            raise InvalidRequest(str(exc)) from None
        # every party takes jobs and holds exactly the uploads the job pins (a stopping
        # party or a lost part is named here, before anything is stored)
        await self._require_ready(list(spec.dataset_ids))
        blob, sha = plan.description.SerializeToString(deterministic=True), plan.sha256
        request = {
            "dataset_ids": list(spec.dataset_ids),
            "combination": spec.combination,
            "label_column": spec.label_column,
            "k": spec.k,
            "security": spec.security,
            "engine": spec.engine,
            "scorer": spec.scorer,
            "training": spec.training,
            "mask_upload_id": spec.mask_upload_id,
            "m": plan.shape.m,
            "p": plan.shape.p,
            "classes": list(plan.classes),
            "columns": list(plan.columns),
            "column_exponents": list(plan.column_exponents),
            "frac_bits": plan.description.frac_bits,
            "outputs": plan.shape.outputs,
        }
        self.registry.create_job(job_id, who.subject, request, blob, sha, len(self.parties))
        return job_id

    async def _require_ready(self, dataset_ids: list[str]) -> None:
        """Before a job is recorded: every party holds the data sets
        (:meth:`UploadKeeper.require_complete`) and none is stopping (its identity, asked
        now, says so: it would refuse StartJob). Both asked at once, so that a frozen
        party costs one call's wait; a stopping party is named first (PartyStopping,
        503), as what to wait for. Availability only: each party refuses StartJob itself
        while it stops."""
        probed, complete = await asyncio.gather(
            self.parties.probe(self.rpc_seconds),
            self.uploads.require_complete(dataset_ids),
            return_exceptions=True,
        )
        if isinstance(probed, list):
            stopping = [(c, i) for c, i in zip(self.parties.clients, probed, strict=True)
                        if i is not None and i.stopping]
            if stopping:
                names = " and ".join(c.name for c, _ in stopping)
                left = max(i.stop_seconds_left for _, i in stopping)
                within = f", at most {left} s more" if left else ""
                raise PartyStopping(
                    "; ".join(f"{c.name} is stopping" for c, _ in stopping)
                    + f" (its operator stopped it: it takes no new job while its unfinished "
                    f"ones end{within}): no job was submitted and nothing of it was stored; "
                    f"submit again once {names} is back",
                    retry_after=max(STOPPING_RETRY_AFTER, left))
        elif isinstance(probed, BaseException):
            raise probed
        if isinstance(complete, BaseException):
            raise complete

    def _spawn(self, job_id: str, resume: bool) -> None:
        task = asyncio.create_task(self._run(job_id, resume), name=f"job-{job_id}")
        self._tasks[job_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(job_id, None))

    async def reconcile(self) -> None:
        """After a restart: pick up every job that had not reached a final state (and
        start sending pending upload decisions)."""
        await self.uploads.start()
        unfinished = self.registry.unfinished_jobs()
        for job in unfinished:  # running jobs keep the ports they were started with
            if job.state == "running":
                desc = pb.JobDescription.FromString(job.description)
                self.ports.hold(job.id, described_ports(desc))
                self._running.add(job.id)
        for job in unfinished:
            log.info("[Gateway.Reconcile] job=%s state=%s", job.id, job.state)
            self._spawn(job.id, resume=True)

    async def close(self) -> None:
        await self.uploads.close()
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # -- running -----------------------------------------------------------------

    async def _run(self, job_id: str, resume: bool) -> None:
        admitted = job_id in self._running  # a running job picked up after a restart
        if not admitted:
            self._waiting.append(job_id)
        try:
            job = self.registry.get_job(job_id) if admitted else await self._admit(job_id)
            if job is None or job.state in FINAL_STATES:
                return  # cancelled while queued
            try:
                while True:
                    try:
                        await self._start_and_watch(job, resume)
                        break
                    except GatewayStorageError as exc:
                        # the registry cannot record the job's progress (its disk is
                        # full): the parties may be running it, so it keeps its ports and
                        # is picked up again, as after a restart, until space is back
                        log.error("[Gateway.Job] job=%s not recorded: %s", job_id, exc)
                        await asyncio.sleep(self.poll_seconds)
                        resume = True
            finally:
                self._running.discard(job_id)
                self._kick()
            # the job is final here; its ports stay taken until every party says so
            await self._settle(job_id)
        finally:
            if job_id in self._waiting:
                self._waiting.remove(job_id)
            self._running.discard(job_id)
            self.ports.release(job_id)
            self._kick()

    def _kick(self) -> None:
        """Wake every job waiting to start (something that may admit one changed)."""
        self._wake.set()
        self._wake = asyncio.Event()

    async def limit(self) -> int:
        """Jobs that may run at once: the setting, capped by the smallest port range."""
        identities = await self.parties.identities()
        return max(1, min(self.max_concurrent,
                          *(max(1, i.mpc_port_count) for i in identities)))

    async def _admit(self, job_id: str) -> JobRecord | None:
        """Wait until the job is the earliest waiting one, fewer than the limit run and
        every party has a free port; then take the ports and pin them in the job's
        description. None when the job became final (cancelled) while it waited."""
        while True:
            wake = self._wake
            job = self.registry.get_job(job_id)
            if job is None or job.state in FINAL_STATES:
                return None
            if self._waiting and self._waiting[0] == job_id:
                try:
                    identities = await self.parties.identities()
                    limit = await self.limit()
                except GatewayError as exc:  # not reachable yet: try again shortly
                    log.warning("[Gateway.Job] job=%s waits for the parties: %s", job_id,
                                type(exc).__name__)
                    identities, limit = [], 0
                job = self.registry.get_job(job_id)
                if job is None or job.state in FINAL_STATES:
                    return None
                if identities and len(self._running) < limit:
                    desc = pb.JobDescription.FromString(job.description)
                    described = described_ports(desc)
                    ports = self.ports.take(
                        job_id, [(i.mpc_port_base, max(1, i.mpc_port_count)) for i in identities],
                        prefer=described)
                    if ports is not None:
                        if ports != described:
                            pinned, sha = pin_ports(desc, identities, ports)
                            self.registry.set_job_description(
                                job_id, pinned.SerializeToString(deterministic=True), sha)
                        self._waiting.popleft()
                        self._running.add(job_id)
                        log.info("[Gateway.Job] job=%s starts on ports %s (%d running)",
                                 job_id, ",".join(map(str, ports)), len(self._running))
                        self._kick()
                        return self.registry.get_job(job_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 5.0)

    async def _settle(self, job_id: str) -> None:
        """Until every party has reported the (final) job final: a party that does not
        know it is sent a cancel (it then refuses a late StartJob), one still running it
        is sent another; an unreachable party is asked again, without end."""
        attempt = 0
        while True:
            job = self.registry.get_job(job_id)
            if job is None:
                return
            pending = [c for c in self.parties.clients
                       if job.parties[c.index].state not in FINAL_STATES]
            if not pending:
                return
            for c in pending:
                try:
                    st = await c.get_job(job_id, timeout=self.rpc_seconds)
                    await self._apply(job_id, c, st)
                    if not JobState.from_proto(st.state).final and attempt > 0:
                        await c.cancel_job(job_id)
                except NotFound:
                    with contextlib.suppress(GatewayError):
                        await c.cancel_job(job_id)
                        st = await c.get_job(job_id, timeout=self.rpc_seconds)
                        await self._apply(job_id, c, st)
                except GatewayError:
                    pass
            attempt += 1
            if attempt == 1 or attempt % 20 == 0:
                log.info("[Gateway.Job] job=%s keeps its ports until %s report it final",
                         job_id, ", ".join(c.name for c in pending))
            await asyncio.sleep(self.poll_seconds)

    async def _start_and_watch(self, job: JobRecord, resume: bool) -> None:
        job_id = job.id
        desc = pb.JobDescription.FromString(job.description)
        req = pb.StartJobRequest(job=desc, description_sha256=job.description_sha256)
        # every party's answer is awaited before anything else happens to the job: a
        # refusal at one party then cancels the others only once they know the job
        answers = await asyncio.gather(
            *(self._start(c, req, resume) for c in self.parties.clients), return_exceptions=True
        )
        errors = [a for a in answers if isinstance(a, BaseException)]
        for err in errors:
            if not isinstance(err, GatewayError):
                raise err
        if errors:
            await self._fail(job_id, f"could not start: {errors[0]}")
            return
        if self.registry.set_job_state(job_id, "running"):
            self._notify(job_id)
        await asyncio.gather(*(self._watch(job_id, c) for c in self.parties.clients))

    async def _start(self, c: PartyClient, req: pb.StartJobRequest, resume: bool) -> None:
        if resume:
            try:
                st = await c.get_job(req.job.job_id)
                await self._apply(req.job.job_id, c, st)
                return
            except NotFound:
                pass
        await c.ready(6.0)  # a party that just restarted: skip the reconnect backoff
        await c.start_job(req)

    async def _watch(self, job_id: str, c: PartyClient) -> None:
        stream = asyncio.create_task(self._stream(job_id, c))
        last_ok = time.monotonic()
        next_poll = last_ok
        refused_since: float | None = None  # its address refuses connections since
        try:
            while not self._final(job_id):
                if time.monotonic() >= next_poll:
                    try:
                        st = await c.get_job(job_id, timeout=self.rpc_seconds)
                        last_ok = time.monotonic()
                        refused_since = None
                        await self._apply(job_id, c, st)
                    except NotFound:
                        await self._fail(job_id, f"{c.name} does not know the job")
                    except GatewayError as exc:
                        now = time.monotonic()
                        silent = now - last_ok
                        if isinstance(exc, PartyRefusesConnections):
                            refused_since = refused_since or now
                        else:
                            refused_since = None
                        if silent > self.silence_seconds or (
                                refused_since is not None
                                and now - refused_since >= self.refused_seconds):
                            await self._fail(job_id, f"lost the connection to {c.name}")
                        else:
                            self._note_silence(
                                job_id, c, silent,
                                refused_left=None if refused_since is None else
                                self.refused_seconds - (now - refused_since))
                    next_poll = time.monotonic() + self.poll_seconds
                if self._final(job_id):
                    break
                # wake early when the job changes (it may have reached a final state)
                await self.wait_change(job_id, max(0.0, next_poll - time.monotonic()))
        finally:
            stream.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stream

    def _note_silence(self, job_id: str, c: PartyClient, silent: float,
                      refused_left: float | None = None) -> None:
        """Show, as the party's phase, that it has not answered for ``silent`` seconds (a
        frozen, overloaded or lost party; with ``refused_left``, one whose address
        refuses connections, and the seconds left before the job fails for it), so that
        a watcher learns what the job waits for before it fails; the party's next answer
        puts its own phase back."""
        job = self.registry.get_job(job_id)
        if job is None or job.state in FINAL_STATES:
            return
        # the time left, not the whole wait: said again at every poll, the whole wait
        # would promise a party refused since then more time than it has
        phase = (f"no answer for {silent:.0f} s: its address refuses connections (stopped?)."
                 f" The job fails unless it is back within {max(refused_left, 0):.0f} s"
                 if refused_left is not None else
                 f"no answer for {silent:.0f} s: frozen or overloaded? The job fails at "
                 f"{self.lost_seconds:g} s of silence")
        now = replace(job.parties[c.index], phase=phase)
        if job.parties[c.index] != now:
            self.registry.set_party_state(job_id, now)
            self._notify(job_id)

    async def _stream(self, job_id: str, c: PartyClient) -> None:
        """Events as they happen; the polling loop covers gaps and lost streams."""
        while not self._final(job_id):
            try:
                async for ev in c.watch_job(job_id):
                    await self._apply(job_id, c, ev.status)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken stream is retried; liveness is polled apart
                log.debug(
                    "[Gateway.WatchJob] job=%s party=%s stream ended: %s",
                    job_id,
                    c.name,
                    type(exc).__name__,
                )
            await asyncio.sleep(1.0)

    def _final(self, job_id: str) -> bool:
        job = self.registry.get_job(job_id)
        return job is None or job.state in FINAL_STATES

    async def _apply(self, job_id: str, c: PartyClient, st: pb.JobStatus) -> None:
        state = JobState.from_proto(st.state).value
        before = self.registry.get_job(job_id)
        if before is None:
            return
        now = PartyJobState(
            party=c.index,
            state=state,
            phase=st.phase[:200],
            progress=max(0.0, min(1.0, st.progress)),
            error=st.error[:300],
            program_sha256=st.program_sha256[:64],
            seconds=st.seconds,
            bytes_sent=st.bytes_sent,
            failure=kind.value if (kind := FailureKind.from_proto(st.failure)) else "",
        )
        if before.parties[c.index] != now:  # write and wake watchers only on a change
            self.registry.set_party_state(job_id, now)
            self._notify(job_id)
        job = self.registry.get_job(job_id)
        if job is None or job.state in FINAL_STATES:
            return
        if state == "failed":
            reason = failure_reason(c.name, st)
            if _symptom(st) or _stalled(st):
                reason = await self._blame(job_id, c, reason, st)
            elif FailureKind.from_proto(st.failure) is FailureKind.RESTARTED:
                reason = await self._all_stopped(job_id, c, reason)
            await self._fail(job_id, reason)
        elif state == "cancelled":
            await self._fail(job_id, f"{c.name} cancelled the job")
        elif all(p.state == "succeeded" for p in job.parties):
            hashes = {p.program_sha256 for p in job.parties}
            if len(hashes) > 1:
                # every party compiled the program itself from the same description: a
                # different hash means some party ran something else
                await self._fail(job_id, "the parties report different program hashes")
                return
            if self.registry.set_job_state(job_id, "succeeded"):
                log.info("[Gateway.Job] job=%s succeeded", job_id)
                self._notify(job_id)

    async def _blame(self, job_id: str, reporter: PartyClient, reason: str,
                     reported: pb.JobStatus) -> str:
        """A party whose engine stopped because a peer went away is a symptom: look for the
        cause (a party that is unreachable, or failed for a reason of its own) for a few
        seconds before naming the reporter. A stall (the reporter's or another party's)
        is no cause either: every party left waiting reports one, and the party whose
        engine was stopped reports its own failure after the same stall limit, a sample
        or two apart; only without a cause does the job fail as stalled, blaming nobody,
        unless every other party's wait refutes the one stall report
        (:func:`refuted_stall`): then its reporter is named."""
        deadline = time.monotonic() + BLAME_SECONDS
        reported_stall = _stalled(reported)
        stalled: str | None = None  # another party's stall, failing any cause
        while True:
            seen = {reporter.name: reported}
            for other in self.parties.clients:
                if other is reporter:
                    continue
                try:
                    st = await other.get_job(job_id, timeout=min(2.0, self.rpc_seconds))
                except NotFound:
                    return f"{other.name} does not know the job"
                except GatewayError:
                    return f"lost the connection to {other.name}"
                seen[other.name] = st
                if st.state == pb.JOB_STATE_FAILED and _stalled(st):
                    stalled = stalled or failure_reason(other.name, st)
                elif st.state == pb.JOB_STATE_FAILED and not _symptom(st):
                    return failure_reason(other.name, st)
            refuted = refuted_stall(seen, self.stall_floor)
            if refuted is not None:
                return refuted_reason(*refuted, floor=self.stall_floor)
            if time.monotonic() >= deadline or self._final(job_id):
                # the reporter's own stall says the same, naming it as the reporter
                return stalled if stalled is not None and not reported_stall else reason
            await asyncio.sleep(0.5)

    async def _all_stopped(self, job_id: str, reporter: PartyClient, reason: str) -> str:
        """A party that stopped (or restarted) while the job ran is named, unless every
        party did: the whole deployment was stopped (`ppfs up` stopped, then started
        again), which is nobody's failure."""
        for other in self.parties.clients:
            if other is reporter:
                continue
            try:
                st = await other.get_job(job_id, timeout=min(2.0, self.rpc_seconds))
            except GatewayError:
                return reason
            if st.state != pb.JOB_STATE_FAILED or \
                    FailureKind.from_proto(st.failure) is not FailureKind.RESTARTED:
                return reason
        return ("the secure run stopped: every party was stopped while it ran (the "
                "deployment was stopped or restarted; no party is blamed)")

    async def _fail(self, job_id: str, reason: str) -> None:
        if self.registry.set_job_state(job_id, "failed", reason):
            log.warning("[Gateway.Job] job=%s failed: %s", job_id, reason)
            self._notify(job_id)
            await self._cancel_everywhere(job_id)

    async def _cancel_everywhere(self, job_id: str) -> None:
        await asyncio.gather(*(self._cancel_at(c, job_id) for c in self.parties.clients))

    async def _cancel_at(self, c: PartyClient, job_id: str) -> None:
        """Send the cancel until the party acknowledges it (a party that does not know
        the job yet remembers it), a bounded number of times."""
        for attempt in range(CANCEL_ATTEMPTS):
            try:
                await c.cancel_job(job_id)
                return
            except GatewayError as exc:
                log.warning(
                    "[Gateway.CancelJob] job=%s party=%s attempt=%d: %s",
                    job_id, c.name, attempt + 1, type(exc).__name__,
                )
            await asyncio.sleep(min(4.0, 0.5 * 2**attempt))
        log.error("[Gateway.CancelJob] job=%s party=%s never acknowledged", job_id, c.name)

    async def cancel(self, who: Principal, job_id: str) -> JobRecord:
        job = self.visible(who, job_id)
        if job.state in FINAL_STATES:
            raise Conflict(f"job {job_id} is already {job.state}")
        if self.registry.set_job_state(job_id, "cancelled", f"cancelled by {who.subject}"):
            self._notify(job_id)
            await self._cancel_everywhere(job_id)
        got = self.registry.get_job(job_id)
        assert got is not None
        return got

    # -- reading -----------------------------------------------------------------

    def visible(self, who: Principal, job_id: str) -> JobRecord:
        job = self.registry.get_job(check_path_id(job_id, "job_id"))
        if job is None or (who.role is not Role.ADMIN and job.submitter != who.subject):
            raise NotFound(f"no job {job_id!r}")
        return job

    def _notify(self, job_id: str) -> None:
        self._kick()  # a job cancelled while it waits leaves the queue
        ev = self._changed.pop(job_id, None)
        if ev is not None:
            ev.set()
        if self.on_change is not None and (job := self.registry.get_job(job_id)) is not None:
            self.on_change(job)

    def change_event(self, job_id: str) -> asyncio.Event:
        """Set at the job's next change. Take it *before* reading the job, then wait."""
        return self._changed.setdefault(job_id, asyncio.Event())

    async def wait_change(
        self, job_id: str, seconds: float, event: asyncio.Event | None = None
    ) -> None:
        ev = event or self.change_event(job_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), seconds)

    async def fetch_result(self, who: Principal, job_id: str) -> list[pb.SealedResultPart]:
        job = self.visible(who, job_id)
        if job.state != "succeeded":
            raise Conflict(f"job {job_id} is {job.state}; a result exists once it succeeded")
        parts = await asyncio.gather(*(c.fetch_result_part(job_id) for c in self.parties.clients))
        for c, part in zip(self.parties.clients, parts, strict=True):
            if part.job_id != job_id or part.party_index != c.index:
                raise GatewayError(f"{c.name} returned a result part of another job")
        return list(parts)


def job_failure_kind(job: JobRecord) -> str:
    """Why a final job did not succeed, as one of a bounded set of words ("" when it
    succeeded or is unfinished): the blamed party's own failure kind where one is
    reported, else what the gateway saw."""
    if job.state == "cancelled":
        return "cancelled"
    if job.state != "failed":
        return ""
    kinds = [p.failure for p in job.parties if p.failure]
    # a stall is what the parties left waiting report: the kind of a party named, or a
    # lost party, comes before it, whichever party is listed first
    own = [k for k in kinds if k not in ("peer_lost", "session", "cancelled", "stalled")]
    if own:
        return own[0]
    err = job.error
    if "lost the connection" in err or "does not know the job" in err:
        return "party_lost"
    if err.startswith("could not start"):
        return "refused"
    if "program hashes" in err:
        return "integrity"
    if "stalled" in kinds:
        return "stalled"
    return kinds[0] if kinds else "other"
