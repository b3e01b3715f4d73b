"""Data sets and their uploads: checks on the public manifest, then a relay of each
sealed part to its party. The gateway cannot open a part; it checks that each part
is the one the owner's manifest names (SHA-256) and that the public schema fits
the data set.

Uploads are all or nothing. Each part is sent *staged* (stored by the party, used by
no job); once every party has stored its part the gateway records the upload in its
data set and the decision "commit" for every party in one transaction, otherwise the
decision "abort", and sends the decision to every party. Decisions live in the
registry until each party acknowledged them (:class:`UploadKeeper` repeats them, so a
party that was down catches up when it is back; an upload whose parts were still being
sent when the gateway stopped is aborted at the next start).

A party keeps a staged part only so long (``ppfs party serve --staged-expiry-hours``),
then aborts it itself and refuses its commit. A commit a party refuses so while no
party has acknowledged it is turned into an abort at every party: the upload leaves its
data set (and an owner still waiting for it is told which parties expired it). Once a
party acknowledged the commit it stands; a party that expired the part is then named in
the log and by ``check`` as not holding the upload.

``check`` compares what every party holds of a data set with what the gateway
recorded; ``repair`` lets an owner re-send the original sealed part of a party that
lost it (checked against the manifest hash recorded at upload time)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass, field

from ppfs.upload import Manifest, UploadRejected
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
    MalformedUpload,
    NotFound,
    PartyRejected,
    PartyUnavailable,
)
from ppfs_gateway.parties import Parties, PartyClient
from ppfs_gateway.registry import DatasetRecord, DatasetSchema, Registry, UploadDecision

log = logging.getLogger("ppfs.gateway")

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_ID = re.compile(ID_PATTERN)
MASK_COLUMNS = ("mask_w0", "mask_w1")
# how long an upload waits for a party's channel to (re)connect before sending
READY_SECONDS = 6.0
# what a party's refusal of a commit says when it expired the staged part itself
# (ppfs_party.store.ShareStore.commit): it will never commit that upload
EXPIRED_REFUSAL = "its staged part expired"
KINDS = ("data", "mask")


def check_path_id(value: str, field: str) -> str:
    """An id from a URL path: refused (naming the field, never echoing it) unless it is
    a well-formed id."""
    if not _ID.match(value):
        raise InvalidRequest(f"{field} must be 1-64 letters, digits, '-' or '_'")
    return value


def safe_text(value: str, field: str, limit: int = 256) -> str:
    """Names shown to people (column names, labels, classes): no control, format (bidi,
    zero-width) or separator characters, at most ``limit`` characters."""
    import unicodedata

    if not value or len(value) > limit:
        raise MalformedUpload(f"{field} must be 1-{limit} characters")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
           for ch in value):
        raise MalformedUpload(f"{field} holds a control or bidirectional formatting character")
    return value


def new_id() -> str:
    return uuid.uuid4().hex


def can_see(dataset: DatasetRecord, who: Principal) -> bool:
    if who.role is Role.ADMIN or dataset.owner_id == who.subject:
        return True
    return dataset.kind == "data" and who.subject in dataset.grants


def visible_dataset(registry: Registry, dataset_id: str, who: Principal) -> DatasetRecord:
    """The data set, or NotFound also when it exists but is not this principal's to see."""
    check_path_id(dataset_id, "dataset_id")
    ds = registry.get_dataset(dataset_id)
    if ds is None or not can_see(ds, who):
        raise NotFound(f"no data set {dataset_id!r}")
    return ds


@dataclass(frozen=True)
class UploadPart:
    manifest: bytes
    signature: bytes
    parts: tuple[bytes, ...]
    upload_id: str


def create_dataset(
    registry: Registry, who: Principal, name: str, kind: str, owner_id: str | None
) -> DatasetRecord:
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}")
    if who.role is Role.ADMIN:
        if not owner_id:
            raise InvalidRequest("an admin creates a data set for an owner: give owner_id")
        owner = owner_id
    else:
        if kind == "data" and who.role is not Role.DATA_OWNER:
            raise Forbidden("only a data owner (or an admin) creates data sets")
        if owner_id and owner_id != who.subject:
            raise Forbidden("a data set is created for its own owner only")
        owner = who.subject
    dataset_id = new_id()
    registry.create_dataset(dataset_id, name, owner, kind)
    log.info("[Gateway.CreateDataset] dataset=%s kind=%s owner=%s", dataset_id, kind, owner)
    got = registry.get_dataset(dataset_id)
    assert got is not None
    return got


def check_manifest(
    ds: DatasetRecord, up: UploadPart, who: Principal, parties: int, registry: Registry
) -> tuple[Manifest, DatasetSchema]:
    if who.subject != ds.owner_id and not (
        ds.kind == "data" and who.role is Role.DATA_OWNER and who.subject in ds.grants
    ):
        raise Forbidden("only the data set's owner, or a data owner granted it, uploads to it")
    man = Manifest.from_bytes(up.manifest)  # UploadRejected -> 422 malformed
    try:
        man.signed_at()  # the upload's place among its data set's uploads
    except UploadRejected as exc:
        raise MalformedUpload(str(exc)) from None
    scheme = "rep3" if parties == 3 else "rep4"
    if man.dataset_id != ds.id or man.upload_id != up.upload_id:
        raise MalformedUpload("the manifest names another data set or upload")
    if man.owner_id != who.subject:
        raise MalformedUpload("the manifest names another owner than the uploader")
    if man.scheme != scheme:
        raise MalformedUpload(
            f"this deployment shares with {scheme}, the manifest says {man.scheme}"
        )
    if len(up.parts) != parties or len(man.part_sha256) != parties:
        raise MalformedUpload(f"an upload has one sealed part per party ({parties})")
    for i, part in enumerate(up.parts):
        if hashlib.sha256(part).hexdigest() != man.part_sha256[i]:
            raise MalformedUpload(f"sealed part {i} does not match the manifest's digest")
    if man.rows < 1 or len(man.columns) < 1 or len(man.columns) != len(man.column_exponents):
        raise MalformedUpload("the manifest's shape is inconsistent")
    for i, name in enumerate(man.columns):
        safe_text(name, f"the manifest's column {i}")
    if man.label_column:
        safe_text(man.label_column, "the manifest's label column")
    for i, name in enumerate(man.classes):
        safe_text(name, f"the manifest's class {i}")
    if len(set(man.columns)) != len(man.columns) or man.label_column in man.columns:
        raise MalformedUpload("the manifest's column names repeat or include the label")
    if bool(man.label_column) != bool(man.classes) or len(man.classes) == 1:
        raise MalformedUpload("the manifest's label needs at least two classes")
    if not 0 <= man.frac_bits <= 40:
        raise MalformedUpload("the manifest's fractional bits are out of range")
    if ds.kind == "mask" and (
        man.columns != MASK_COLUMNS or man.label_column or any(man.column_exponents)
    ):
        raise MalformedUpload(f"a mask upload has the columns {', '.join(MASK_COLUMNS)} only")
    if registry.upload_exists(up.upload_id):
        raise Conflict(f"upload {up.upload_id!r} already exists")
    schema = DatasetSchema(
        columns=man.columns,
        column_exponents=man.column_exponents,
        label_column=man.label_column,
        classes=man.classes,
        frac_bits=man.frac_bits,
        scheme=man.scheme,
    )
    if ds.kind == "mask" and ds.upload_ids:
        raise Conflict("a mask data set holds exactly one upload")
    if ds.schema is not None and ds.schema != schema:
        raise IncompatibleSchemas(
            "this upload's schema (columns, exponents, label, classes, fractional bits) "
            "differs from the data set's; encode with the data set's schema"
        )
    return man, schema


_STATUS_NAMES = {
    pb.UPLOAD_STATUS_STAGED: "staged",
    pb.UPLOAD_STATUS_COMMITTED: "committed",
    pb.UPLOAD_STATUS_ABORTED: "aborted",
    pb.UPLOAD_STATUS_DAMAGED: "damaged",
}


@dataclass
class PartyHolding:
    """What one party holds of a data set against what the gateway recorded."""

    index: int
    name: str
    reachable: bool
    error: str = ""
    held: list[tuple[str, str, str, int]] = field(default_factory=list)  # id, status, sha, rows
    missing: list[str] = field(default_factory=list)  # recorded, not held (nor staged)
    # recorded, its share file damaged there (set aside): also missing, which the owner's
    # repair re-sends
    damaged: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # recorded, staged: commit not yet sent
    mismatched: list[str] = field(default_factory=list)  # held under another manifest
    unexpected: list[str] = field(default_factory=list)  # committed there, not recorded here

    @property
    def consistent(self) -> bool:
        return self.reachable and not (
            self.missing or self.pending or self.mismatched or self.unexpected
        )

    def problems(self, dataset_id: str) -> list[str]:
        out = [
            f"{self.name} does not hold upload {u!r} of data set {dataset_id!r}"
            for u in self.missing if u not in self.damaged
        ]
        out += [
            f"{self.name}'s stored share file of upload {u!r} of data set {dataset_id!r} "
            f"is damaged (set aside there, used by no job): its owner re-sends the part "
            f"with `ppfs datasets repair {dataset_id}`"
            for u in self.damaged
        ]
        out += [
            f"upload {u!r} of data set {dataset_id!r} is not committed at {self.name} yet"
            for u in self.pending
        ]
        out += [
            f"{self.name} holds upload {u!r} of data set {dataset_id!r} under another manifest"
            for u in self.mismatched
        ]
        out += [
            f"{self.name} holds upload {u!r} of data set {dataset_id!r}, which the gateway "
            "never recorded"
            for u in self.unexpected
        ]
        return out


@dataclass
class DatasetCheck:
    dataset_id: str
    recorded: list[tuple[str, str, str, int]]  # upload id, owner, manifest sha, rows
    parties: list[PartyHolding]

    @property
    def consistent(self) -> bool:
        return all(p.consistent for p in self.parties)


class UploadKeeper:
    """Sends the recorded commit/abort decisions until every party acknowledged them;
    checks and repairs what parties hold."""

    def __init__(
        self, registry: Registry, parties: Parties, retry_seconds: float = 2.0,
        rpc_seconds: float = 10.0,
    ) -> None:
        self.registry = registry
        self.parties = parties
        self.retry_seconds = retry_seconds
        self.rpc_seconds = rpc_seconds
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    def lock(self, dataset_id: str) -> asyncio.Lock:
        """Uploads to one data set go one at a time (its schema is set by the first)."""
        return self._locks.setdefault(dataset_id, asyncio.Lock())

    async def start(self) -> None:
        aborted = self.registry.abort_interrupted()
        if aborted:
            log.warning("[Gateway.Upload] %d interrupted upload parts are aborted", aborted)
        self._task = asyncio.create_task(self._loop(), name="upload-decisions")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _loop(self) -> None:
        while True:
            try:
                await self.flush()
            except Exception as exc:  # never let the keeper die; the next round retries
                log.error("[Gateway.UploadDecision] round failed: %s", type(exc).__name__)
            await asyncio.sleep(self.retry_seconds)

    async def flush(
        self, upload_id: str | None = None, dataset_id: str | None = None
    ) -> list[UploadDecision]:
        """Send every pending decision (of one upload or data set); what is still pending."""
        pending = self.registry.decisions(pending=True, upload_id=upload_id,
                                          dataset_id=dataset_id)
        if pending:
            answers = await asyncio.gather(*(self._send(d) for d in pending))
            expired: dict[str, dict[int, str]] = {}
            for d, refusal in zip(pending, answers, strict=True):
                if refusal:
                    expired.setdefault(d.upload_id, {})[d.party] = refusal
            for uid, refusals in expired.items():
                self._expired(uid, refusals)
        return self.registry.decisions(pending=True, upload_id=upload_id, dataset_id=dataset_id)

    async def _send(self, d: UploadDecision) -> str:
        """Send one decision; the party's refusal if it refused a commit because it
        expired the staged part, else ""."""
        c = self.parties.clients[d.party]
        commit = d.decision == "commit"
        try:
            await c.decide_upload(d.dataset_id, d.upload_id, commit, timeout=self.rpc_seconds)
        except GatewayError as exc:
            if d.attempts == 0 or d.attempts % 30 == 0:
                log.warning(
                    "[Gateway.UploadDecision] upload=%s party=%s %s not acknowledged: %s",
                    d.upload_id, c.name, d.decision, type(exc).__name__,
                )
            self.registry.decision_done(d.upload_id, d.party, error=str(exc),
                                        decision=d.decision)
            return str(exc) if commit and isinstance(exc, PartyRejected) and (
                EXPIRED_REFUSAL in str(exc)) else ""
        self.registry.decision_done(d.upload_id, d.party, decision=d.decision)
        log.info("[Gateway.UploadDecision] upload=%s party=%s %s acknowledged",
                 d.upload_id, c.name, d.decision)
        return ""

    def _expired(self, upload_id: str, refusals: dict[int, str]) -> None:
        """Parties refused to commit ``upload_id``, having expired their staged part:
        aborted everywhere and out of its data set, unless a party committed it."""
        names = ", ".join(self.parties.clients[i].name for i in sorted(refusals))
        if self.registry.drop_expired_upload(upload_id, refusals):
            log.warning("[Gateway.UploadDecision] upload=%s not added: %s expired the staged "
                        "part before the commit reached it; every party aborts it",
                        upload_id, names)
        else:
            log.error("[Gateway.UploadDecision] upload=%s: %s expired the staged part before "
                      "the commit reached it, another party committed it: held by only "
                      "some parties (ppfs datasets check names them)", upload_id, names)

    # -- checks ------------------------------------------------------------------

    async def check(self, ds: DatasetRecord, verify: bool = False) -> DatasetCheck:
        """Every party's holdings of ``ds`` against the registry (one ListUploads each;
        ``verify``: each party reads every share file of it first, and one it finds
        damaged is reported so)."""
        recorded = [
            (uid, owner, sha, rows)
            for uid, sha, rows in self.registry.upload_pins(ds.id)
            for owner in [self._owner(uid)]
        ]
        pending = {
            (d.upload_id, d.party)
            for d in self.registry.decisions(pending=True, dataset_id=ds.id)
            if d.decision == "commit"
        }
        seconds = self.rpc_seconds + (_verify_seconds(ds) if verify else 0.0)
        answers = await asyncio.gather(
            *(c.list_uploads(ds.id, timeout=seconds, verify=verify)
              for c in self.parties.clients),
            return_exceptions=True,
        )
        holdings = []
        for c, ans in zip(self.parties.clients, answers, strict=True):
            holdings.append(self._holding(c, ans, recorded, pending))
        return DatasetCheck(ds.id, recorded, holdings)

    def _owner(self, upload_id: str) -> str:
        found = self.registry.upload_owner(upload_id)
        return found[1] if found else ""

    @staticmethod
    def _holding(
        c: PartyClient, ans: object, recorded: list[tuple[str, str, str, int]],
        pending: set[tuple[str, int]],
    ) -> PartyHolding:
        if isinstance(ans, BaseException):
            if not isinstance(ans, GatewayError):
                raise ans
            return PartyHolding(c.index, c.name, False, error=str(ans)[:300])
        assert isinstance(ans, pb.ListUploadsResponse)
        h = PartyHolding(c.index, c.name, True)
        held = {u.upload_id: u for u in ans.uploads}
        h.held = [
            (u.upload_id, _STATUS_NAMES.get(u.status, "unknown"), u.manifest_sha256, u.rows)
            for u in ans.uploads
        ]
        known = set()
        for uid, _owner, sha, _rows in recorded:
            known.add(uid)
            got = held.get(uid)
            if got is None:
                h.missing.append(uid)
            elif got.status == pb.UPLOAD_STATUS_DAMAGED:
                h.missing.append(uid)
                h.damaged.append(uid)
            elif got.manifest_sha256 != sha:
                h.mismatched.append(uid)
            elif got.status != pb.UPLOAD_STATUS_COMMITTED:
                (h.pending if (uid, c.index) in pending else h.missing).append(uid)
        h.unexpected = [
            u.upload_id for u in ans.uploads
            if u.upload_id not in known and u.status == pb.UPLOAD_STATUS_COMMITTED
        ]
        return h

    async def learn_signed_times(self, dataset_ids: list[str]) -> None:
        """Uploads recorded before the registry kept their owner-signed times: learn each
        one's from the parties' listings (the time in the manifest each party verified)
        once every party states the same, so that jobs list a data set's uploads in the
        order every party requires (until then, by id; a party that cannot be reached or
        disagrees leaves it to a later job). Nothing to do (and no call) for uploads
        recorded since."""
        for dataset_id in dataset_ids:
            unknown = self.registry.uploads_without_signed_time(dataset_id)
            if not unknown:
                continue
            answers = await asyncio.gather(
                *(c.list_uploads(dataset_id, timeout=self.rpc_seconds)
                  for c in self.parties.clients),
                return_exceptions=True,
            )
            stated: dict[str, list[str]] = {}
            for ans in answers:
                if isinstance(ans, pb.ListUploadsResponse):
                    for u in ans.uploads:
                        if u.upload_id in unknown:
                            stated.setdefault(u.upload_id, []).append(u.signed_at)
            for upload_id, times in stated.items():
                if len(times) == len(answers) and len(set(times)) == 1 and (
                        signed_at := times[0]):
                    self.registry.set_signed_at(upload_id, signed_at)
                    log.info("[Gateway.Uploads] upload=%s signed time learnt from the parties",
                             upload_id)

    async def require_complete(self, dataset_ids: list[str]) -> None:
        """Before a job: every party answers, and holds exactly the recorded uploads of
        every data set, committed. Pending commits are sent first. A party that does not
        answer (down, or frozen: each call waits at most ``rpc_seconds``) is named here,
        before anything of the job is stored: a job it cannot start is never recorded."""
        # a party that just restarted is reached at once, not after the reconnect backoff
        await asyncio.gather(*(c.ready(self.rpc_seconds) for c in self.parties.clients))
        await asyncio.gather(*(self.flush(dataset_id=d) for d in dataset_ids))
        datasets = [ds for d in dataset_ids if (ds := self.registry.get_dataset(d)) is not None]
        checks = await asyncio.gather(*(self.check(ds) for ds in datasets))
        silent = {p.index: p for check in checks for p in check.parties if not p.reachable}
        if silent:
            raise PartyUnavailable(
                "; ".join(p.error for p in silent.values())
                + ": no job was submitted and nothing of it was stored; submit again once "
                + " and ".join(p.name for p in silent.values())
                + " answers (its operator checks that it runs and is not overloaded)"
            )
        for check in checks:
            problems = [msg for p in check.parties for msg in p.problems(check.dataset_id)]
            if problems:
                raise Conflict(
                    "; ".join(problems[:4])
                    + f". See `ppfs datasets check {check.dataset_id}`; the upload's owner "
                    f"restores a lost part with `ppfs datasets repair {check.dataset_id}`"
                )

    # -- repair ------------------------------------------------------------------

    async def repair(
        self, ds: DatasetRecord, who: Principal, upload_id: str, party: int, manifest: bytes,
        signature: bytes, part: bytes, repair: bytes = b"", repair_signature: bytes = b"",
    ) -> DatasetCheck:
        """Re-send the original sealed part of ``upload_id`` to a party that lost it,
        with the owner's signed repair (which a party that expired the part needs)."""
        found = self.registry.upload_owner(check_path_id(upload_id, "upload_id"))
        if found is None or found[0] != ds.id:
            raise NotFound(f"no upload {upload_id!r} in data set {ds.id!r}")
        _, owner, sha, rows = found
        if owner != who.subject:
            raise Forbidden("only the upload's owner re-sends its parts")
        if not 0 <= party < len(self.parties):
            raise InvalidRequest(f"party must be 0..{len(self.parties) - 1}")
        if hashlib.sha256(manifest).hexdigest() != sha:
            raise MalformedUpload("the manifest is not the one recorded for this upload")
        man = Manifest.from_bytes(manifest)
        if hashlib.sha256(part).hexdigest() != man.part_sha256[party]:
            raise MalformedUpload(
                f"the part does not match the manifest's digest for party {party}"
            )
        c = self.parties.clients[party]
        async with self.lock(ds.id):
            before = await self.check(ds)
            h = before.parties[party]
            if not h.reachable:
                raise PartyUnavailable(f"{c.name} cannot be reached: {h.error}")
            status = {u: s for u, s, _sha, _r in h.held}.get(upload_id)
            if status == "committed":
                raise Conflict(f"{c.name} holds upload {upload_id!r}; nothing to repair")
            if status in (None, "damaged"):  # a damaged one is set aside: sent anew
                await c.put_upload_part(
                    pb.UploadPartHeader(
                        dataset_id=ds.id, upload_id=upload_id, owner_id=owner,
                        manifest=manifest, manifest_signature=signature,
                        sealed_size=len(part), staged=True, repair=repair,
                        repair_signature=repair_signature,
                    ),
                    part,
                )
            await c.decide_upload(ds.id, upload_id, True, timeout=self.rpc_seconds)
            self.registry.decision_done(upload_id, party)
        log.info("[Gateway.Repair] dataset=%s upload=%s party=%s rows=%d", ds.id, upload_id,
                 c.name, rows)
        return await self.check(ds)


async def _abort_unrecorded(
    parties: Parties, dataset_id: str, upload_id: str, seconds: float
) -> list[str]:
    """Tell every party to drop an upload whose decision the registry could not record
    (its disk is full); the names of the parties not reached. The registry still holds
    the upload as being sent, so the gateway's next start aborts it there as well."""
    answers = await asyncio.gather(
        *(c.decide_upload(dataset_id, upload_id, False, timeout=seconds)
          for c in parties.clients),
        return_exceptions=True,
    )
    missed = [c.name for c, a in zip(parties.clients, answers, strict=True)
              if isinstance(a, BaseException)]
    log.warning("[Gateway.Upload] dataset=%s upload=%s not recorded (gateway storage): "
                "aborted at the parties, %d not reached", dataset_id, upload_id, len(missed))
    return missed


async def relay_upload(
    registry: Registry, parties: Parties, ds: DatasetRecord, up: UploadPart, who: Principal,
    keeper: UploadKeeper,
) -> DatasetRecord:
    if not _ID.match(up.upload_id):
        raise InvalidRequest("upload_id must be 1-64 letters, digits, '-' or '_'")
    async with keeper.lock(ds.id):
        current = registry.get_dataset(ds.id)
        assert current is not None
        man, schema = check_manifest(current, up, who, len(parties), registry)
        started = time.monotonic()
        await asyncio.gather(*(c.ready(READY_SECONDS) for c in parties.clients))
        registry.stage_upload(ds.id, up.upload_id, len(parties))
        results = await asyncio.gather(
            *(
                c.put_upload_part(
                    pb.UploadPartHeader(
                        dataset_id=ds.id,
                        upload_id=up.upload_id,
                        owner_id=who.subject,
                        manifest=up.manifest,
                        manifest_signature=up.signature,
                        sealed_size=len(up.parts[c.index]),
                        staged=True,
                    ),
                    up.parts[c.index],
                )
                for c in parties.clients
            ),
            return_exceptions=True,
        )
        failure: BaseException | None = None
        for c, r in zip(parties.clients, results, strict=True):
            if isinstance(r, BaseException):
                failure = failure or r
            elif r.upload_id != up.upload_id or r.rows != man.rows:
                failure = failure or PartyRejected(f"{c.name} acknowledged another upload or shape")
        if failure is not None:
            try:
                registry.abort_upload(up.upload_id)
            except GatewayStorageError as exc:  # told at once; its restart aborts it too
                await _abort_unrecorded(parties, ds.id, up.upload_id, keeper.rpc_seconds)
                raise type(exc)(f"{exc}; a party did not store its part: the upload was "
                                "not added and no party uses any part of it") from None
            left = await keeper.flush(upload_id=up.upload_id)
            log.warning(
                "[Gateway.Upload] dataset=%s upload=%s aborted (%s); %d parties to tell later",
                ds.id, up.upload_id, type(failure).__name__, len(left),
            )
            if isinstance(failure, GatewayError):
                later = (
                    f"; {', '.join(parties.clients[d.party].name for d in left)} will drop "
                    "any part of it when back"
                    if left
                    else ""
                )
                raise type(failure)(
                    f"{failure}; the upload was not added and no party uses any part of it"
                    + later
                ) from None
            raise failure
        try:
            registry.commit_upload(ds.id, up.upload_id, who.subject, schema, man.rows,
                                   man.digest(), man.signed_at())
        except GatewayStorageError as exc:
            # every party stored its part but the registry could not record the upload:
            # no party may keep it (their staged parts would wait for a decision forever)
            missed = await _abort_unrecorded(parties, ds.id, up.upload_id, keeper.rpc_seconds)
            later = (f"; {', '.join(missed)} will drop its part when the gateway restarts"
                     if missed else "")
            raise type(exc)(f"{exc}; the upload was not added and no party uses any part "
                            f"of it{later}") from None
        left = await keeper.flush(upload_id=up.upload_id)
        refusals = [d.error for d in registry.decisions(upload_id=up.upload_id)
                    if EXPIRED_REFUSAL in d.error]
        if refusals and registry.upload_owner(up.upload_id) is None:
            # the commit came too late: parties had expired their staged parts (this
            # gateway stalled past their expiry), so it was turned into an abort
            left = await keeper.flush(upload_id=up.upload_id)
            later = (f"; {', '.join(parties.clients[d.party].name for d in left)} will drop "
                     "any part of it when back" if left else "")
            raise PartyRejected(
                "; ".join(refusals) + "; the upload was not added and no party uses any "
                "part of it" + later)
    log.info(
        "[Gateway.Upload] dataset=%s upload=%s rows=%d columns=%d seconds=%.2f pending=%d",
        ds.id,
        up.upload_id,
        man.rows,
        len(man.columns),
        time.monotonic() - started,
        len(left),
    )
    got = registry.get_dataset(ds.id)
    assert got is not None
    return got


# A party asked to verify a data set reads all of its share files: give it the time to
# read them at this rate on top of an instant answer (a large data set on a slow disk
# is not a frozen party).
VERIFY_BYTES_PER_SECOND = 32 << 20


def _verify_seconds(ds: DatasetRecord) -> float:
    """Seconds a party may take to read ``ds``'s share files: every value, and each
    row's class indicators, as at most three 8-byte components."""
    width = len(ds.schema.columns) + len(ds.schema.classes) if ds.schema else 2
    return ds.rows * max(width, 2) * 24 / VERIFY_BYTES_PER_SECOND
