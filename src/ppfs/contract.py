"""The job contract: what one job is, stated once for client, gateway and parties.

A :class:`JobContract` names everything a job computes on and everything it computes:
the data sets and the exact uploads (id and manifest SHA-256) they consist of, how
they are combined, the label, k, the scorer, the security setting and engine, Step 2B's full
parameters (fractional bits included), the recipient's key and mask upload, and the
plan that follows from them (:func:`plan`: m, p, classes, outputs). It converts to
and from the wire form (``ppfs.v1.JobDescription``); the SHA-256 of that form's
deterministic encoding (:func:`description_sha256`) is what every party must agree
on, and :meth:`JobContract.session_tag` derives from it the tag each engine party
checks against its peers before touching any data.

Job states (:class:`JobState`) and failure kinds (:class:`FailureKind`) are defined
here and in the proto enums with the same names (a test checks that they agree); a
failure travels as a kind, never as wording to be matched.

The result part of one party (:func:`seal_result`, :func:`open_result`): the opened
(value + mask) words as little-endian uint64, sealed to the recipient, signed by the
party over ``job_id || sealed``.

Owner consents (:class:`Consent`): a party runs a job only when every owner of
every upload the job pins signed a consent naming the data set, the recipient
(subject and box key) and what may be revealed (:class:`Reveal`); the consents
travel in the description (field 19, the recipient's subject in 20) and each party
checks them against its own registered owner keys (:func:`check_consents`), so a
gateway cannot point a job at a recipient the owners never agreed to.

Result statements (:class:`ResultStatement`): each party signs, next to its sealed
part, what the words mean (columns, exponents, classes and shape as it verified
them from the owner-signed manifests) and the SHA-256 of the recipient's signed request
the job ran for. The recipient decodes only with a statement every party signed
identically, never with the gateway's job record, and only for the job id it asked for
and the request it submitted as that job.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey, VerifyKey

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
from ppfs.fixedpoint import MAX_FRAC_BITS, FixedPoint
from ppfs.scoring import SCORER_NAMES, Scorer
from ppfs.step2a import Security, Step2AShape
from ppfs.step2b import TrainParams
from ppfs.v1 import party_pb2 as pb

CONTRACT_VERSION = 3  # 2: owner consents, the recipient and the scorer; 3: the request
# versions a party still reads from its own records (jobs it accepted before an upgrade:
# their results stay fetchable); a new job must be CONTRACT_VERSION
STORED_CONTRACT_VERSIONS = (2, 3)
CONSENT_PURPOSE = "ppfs consent v1"
# a consent asking for a minimum of rows (Consent.min_rows): a purpose of its own, so that
# a party of an earlier version, which would not read the minimum, refuses it as malformed
CONSENT_PURPOSE_MIN_ROWS = "ppfs consent v2"
# a consent asking for a minimum of the owner's own rows (Consent.min_own_rows), with or
# without a minimum of rows in all: a purpose of its own again, so that a party that
# counts only the rows in all refuses it rather than running a job on a few of the
# owner's rows padded with another owner's
CONSENT_PURPOSE_MIN_OWN_ROWS = "ppfs consent v3"
# a consent naming the security settings it allows (Consent.securities), with or without
# either minimum of rows: a purpose of its own again, so that a party that does not read
# the settings refuses it rather than run the job in a setting its owner did not allow
CONSENT_PURPOSE_SECURITIES = "ppfs consent v4"
RESULT_PURPOSE = "ppfs result v1"
REQUEST_PURPOSE = "ppfs job request v1"
ENGINES = ("mp-spdz", "mpyc")
# the session tag's bits (ppfs.engines.base.SESSION_WORDS words of 63 bits): all of a
# SHA-256 but four. A gateway chooses the job ids it sends, so a tag it could find two
# descriptions of (some 2^(bits/2) hashes; 2^32 for one 63-bit word) would have two
# honest parties run different jobs in one session
SESSION_TAG_BITS = 252


class JobState(enum.StrEnum):
    """queued -> running -> succeeded | failed | cancelled; a final state is kept."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    def to_proto(self) -> pb.JobState:
        return cast("pb.JobState", pb.JobState.Value(f"JOB_STATE_{self.name}"))

    @classmethod
    def from_proto(cls, value: int) -> JobState:
        name = pb.JobState.Name(value).removeprefix("JOB_STATE_")
        return cls.QUEUED if name == "UNSPECIFIED" else cls[name]


class FailureKind(enum.StrEnum):
    """Why a job failed on a party. The gateway blames from this alone."""

    OWN = "own"  # a reason of the party's own
    PEER_LOST = "peer_lost"  # another party went away first
    TIMEOUT = "timeout"
    INTEGRITY = "integrity"  # the input checks failed: a server altered its share
    REFUSED = "refused"  # parameters or pinned inputs not acceptable to the party
    CANCELLED = "cancelled"  # told to stop
    SESSION = "session"  # the engine's peers ran another job
    RESTARTED = "restarted"  # the party restarted while the job was unfinished
    OUT_OF_RANGE = "out_of_range"  # a Step 2B range check opened 1 (the data's doing)
    # the run made no progress: a peer stopped answering, which one the reporter cannot see
    STALLED = "stalled"

    @property
    def symptom(self) -> bool:
        """True when the kind only reports that something happened elsewhere."""
        return self in (FailureKind.PEER_LOST, FailureKind.SESSION, FailureKind.CANCELLED)

    @property
    def collective(self) -> bool:
        """True when every party stops alike and the cause cannot be pinned on the
        reporter: a range check every party opened, input checks that failed (the
        engine cannot tell which server altered its share), or a run that stalled (a
        peer stopped answering: the reporter is one of those left waiting)."""
        return self in (FailureKind.OUT_OF_RANGE, FailureKind.INTEGRITY, FailureKind.STALLED)

    def to_proto(self) -> pb.FailureKind:
        return cast("pb.FailureKind", pb.FailureKind.Value(f"FAILURE_KIND_{self.name}"))

    @classmethod
    def from_proto(cls, value: int) -> FailureKind | None:
        """The kind, None when unspecified or unknown here: a newer party's kind (as
        STALLED was to every gateway before it) reads as a failure of no stated kind,
        the reporter's own, rather than as an error that leaves its job running."""
        try:
            name = pb.FailureKind.Name(value).removeprefix("FAILURE_KIND_")
        except ValueError:
            return None
        return cls.__members__.get(name)


def failure_kind(exc: BaseException) -> FailureKind:
    """The kind of a failure raised while running a job."""
    if isinstance(exc, IntegrityError):
        return FailureKind.INTEGRITY
    if isinstance(exc, RangeAbortError):
        return FailureKind.OUT_OF_RANGE
    if isinstance(exc, SessionMismatchError):
        return FailureKind.SESSION
    if isinstance(exc, PeerLostError):
        return FailureKind.PEER_LOST
    if isinstance(exc, StalledError):
        return FailureKind.STALLED
    if isinstance(exc, TimedOutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, ParameterError | ShareFormatError):
        return FailureKind.REFUSED
    if isinstance(exc, EngineError):
        return FailureKind.OWN
    return FailureKind.OWN


class Combination(enum.StrEnum):
    HORIZONTAL = "horizontal"  # same columns, rows appended
    VERTICAL = "vertical"  # same row order, columns joined

    def to_proto(self) -> pb.Combination:
        return cast("pb.Combination", pb.Combination.Value(f"COMBINATION_{self.name}"))

    @classmethod
    def parse(cls, text: str) -> Combination:
        try:
            return cls(text)
        except ValueError:
            raise ParameterError("combination must be 'horizontal' or 'vertical'") from None


@dataclass(frozen=True)
class PinnedUpload:
    upload_id: str
    manifest_sha256: str
    rows: int


@dataclass(frozen=True)
class PinnedDataset:
    dataset_id: str
    uploads: tuple[PinnedUpload, ...]

    @property
    def rows(self) -> int:
        return sum(u.rows for u in self.uploads)


@dataclass(frozen=True)
class DatasetSchema:
    """What :func:`plan` needs of one data set (public facts only)."""

    dataset_id: str
    columns: tuple[str, ...]
    column_exponents: tuple[int, ...]
    label_column: str  # "" when the data set carries no label
    classes: tuple[str, ...]
    frac_bits: int
    rows: int


class IncompatibleDatasets(ParameterError):
    """The job's data sets cannot be combined as asked."""


@dataclass(frozen=True)
class Plan:
    m: int
    p: int
    columns: tuple[str, ...]
    column_exponents: tuple[int, ...]
    classes: tuple[str, ...]
    frac_bits: int
    labelled: tuple[int, ...]  # indices of the data sets that carry the label


def plan(schemas: Sequence[DatasetSchema], combination: Combination, label_column: str) -> Plan:
    """The combination rules: the combined table's m, p, columns and classes."""
    if not schemas:
        raise ParameterError("name at least one data set")
    if len({s.dataset_id for s in schemas}) != len(schemas):
        raise ParameterError("a data set is named twice")
    if len({s.frac_bits for s in schemas}) != 1:
        raise IncompatibleDatasets("the data sets were encoded with different fractional bits")
    if not label_column:
        raise ParameterError("give the label column")
    first = schemas[0]
    if combination is Combination.HORIZONTAL or len(schemas) == 1:
        for s in schemas[1:]:
            if (s.columns, s.column_exponents, s.label_column, s.classes) != (
                first.columns, first.column_exponents, first.label_column, first.classes,
            ):
                raise IncompatibleDatasets(
                    f"data set {s.dataset_id!r} differs from {first.dataset_id!r} in columns, "
                    "exponents, label or classes; horizontal combination needs the same schema"
                )
        if first.label_column != label_column:
            raise ParameterError(f"the data sets have no label column {label_column!r}")
        return Plan(
            m=sum(s.rows for s in schemas), p=len(first.columns), columns=first.columns,
            column_exponents=first.column_exponents, classes=first.classes,
            frac_bits=first.frac_bits, labelled=tuple(range(len(schemas))),
        )
    if len({s.rows for s in schemas}) != 1:
        raise IncompatibleDatasets("vertical combination needs the same number of rows")
    columns = tuple(c for s in schemas for c in s.columns)
    if len(set(columns)) != len(columns):
        raise IncompatibleDatasets("vertical combination needs distinct column names")
    labelled = [i for i, s in enumerate(schemas) if s.label_column]
    if len(labelled) != 1 or schemas[labelled[0]].label_column != label_column:
        raise ParameterError(f"exactly one data set must hold the label column {label_column!r}")
    return Plan(
        m=first.rows, p=len(columns), columns=columns,
        column_exponents=tuple(e for s in schemas for e in s.column_exponents),
        classes=schemas[labelled[0]].classes, frac_bits=first.frac_bits,
        labelled=tuple(labelled),
    )


def training_from_body(training: Mapping[str, Any] | None) -> TrainParams | None:
    """Step 2B's parameters from a REST job body (``epochs``, ``batch_size``,
    ``learning_rate``, optional ``seed``, ``frac_bits``, ``sigmoid``); ParameterError
    when out of range."""
    if not training:
        return None
    default = TrainParams()
    try:
        return TrainParams(
            epochs=int(training["epochs"]), batch=int(training["batch_size"]),
            lr=float(training["learning_rate"]), seed=int(training.get("seed", 0)),
            frac_bits=int(training.get("frac_bits", default.frac_bits)),
            sigmoid=str(training.get("sigmoid", default.sigmoid)),
            weight_bits=int(training.get("weight_bits", default.weight_bits)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ParameterError(f"training parameters are incomplete ({exc})") from None


def service_shape(
    m: int, p: int, n_classes: int, k: int, value_bits: int, train: TrainParams | None,
    scorer: Scorer = Scorer.MS_GINI,
) -> Step2AShape:
    """The public shape of a service job. A service job never opens D' (the data
    owners' rows): the recipient gets only the selection and, with training, the model."""
    return Step2AShape(m, p, n_classes, k, value_bits, reveal_reduced=False, train=train,
                       scorer=scorer)


def parse_scorer(name: str) -> Scorer:
    """A scorer by name (empty: MS-GINI); ParameterError naming the choices otherwise."""
    try:
        return Scorer(name or Scorer.MS_GINI.value)
    except ValueError:
        raise ParameterError(f"unknown scorer {name!r}; choose one of "
                             f"{', '.join(SCORER_NAMES)}") from None


class Reveal(enum.StrEnum):
    """What an owner lets a recipient learn from a job on its data."""

    SELECTION = "selection"  # the k selected column indices
    MODEL = "selection+model"  # and the Step 2B model on them

    def covers(self, training: bool) -> bool:
        return self is Reveal.MODEL or not training


class ConsentError(ParameterError):
    """A job lacks a valid consent of an owner whose data it uses."""


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # UTC, as consents state their times
MAX_CONSENT_JOBS = 1_000_000
# the bounds of Consent.min_rows and Consent.min_own_rows
MIN_CONSENT_ROWS, MAX_CONSENT_ROWS = 2, 1_000_000_000
MAX_CONSENT_BYTES = 4096  # a consent statement is a few hundred bytes
# who a consent names: subject ids (the gateway's token subjects, the parties' owner ids)
# and a data set id; nothing a terminal would act on when a consent is listed
_SUBJECT = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def utc_time(text: str) -> dt.datetime:
    """A consent's time (TIME_FORMAT); ValueError otherwise."""
    return dt.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=dt.UTC)


def consent_securities(names: Iterable[str | Security]) -> frozenset[Security]:
    """The security settings ``names`` name (as :attr:`Consent.securities`): each one
    of ppfs's, at least one; ValueError naming the others."""
    wanted = [n.value if isinstance(n, Security) else str(n).strip() for n in names]
    known = {s.value: s for s in Security}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise ValueError(
            (f"unknown security setting {unknown[0][:40]!r}; " if unknown else
             "name at least one security setting; ")
            + f"choose among {', '.join(known)}")
    return frozenset(known[n] for n in wanted)


@dataclass(frozen=True)
class Consent:
    """An owner's permission: jobs on ``dataset_id`` may reveal ``reveal`` to the
    recipient ``recipient`` holding the X25519 key ``recipient_public_key``; with
    ``expires_at`` (UTC, TIME_FORMAT), only jobs a party accepts before then; with
    ``max_jobs`` above 0, at most that many jobs (each party counts the jobs it accepted
    under this very statement, :func:`check_consents`); with ``min_rows`` above 0, only
    jobs that pin at least that many rows of the data set in all (as each party counts
    them from the owner-signed manifests it holds), so that a gateway holding back the
    other uploads cannot have the result computed over a handful of rows.

    With ``min_own_rows`` above 0, only jobs that pin at least that many rows of the
    data set from uploads this owner signed (the manifests naming ``owner_id``, each
    verified against the owner's key when the party stored it): other owners' rows do
    not count, so that a co-owner working with the gateway cannot pad the count with
    rows it knows while the gateway holds back this owner's uploads. An upload holds
    whole rows of the data set, so the count is the same whatever the job does with the
    data set: stacked with other data sets (horizontal), the owner's rows are among the
    job's rows; joined by columns with other data sets (vertical), each of the owner's
    rows is one of the job's rows, its columns beside the other data sets' on the same
    row. Both minimums may be set; each must be met.

    With ``securities`` (a non-empty set of security settings), only jobs run in one of
    them, as the job's signed description states it: an owner who trusts the parties to
    be an honest majority but not to follow the protocol allows the active settings
    only, where a corrupted party cannot change the result undetected nor make a job's
    abort depend on the data. Empty, any setting the recipient asks for."""

    owner_id: str
    dataset_id: str
    recipient: str
    recipient_public_key: bytes
    reveal: Reveal
    created_at: str = ""
    expires_at: str = ""  # "" never: left out of the signed form
    max_jobs: int = 0  # 0 any number: left out of the signed form
    # 0 no minimum: left out of the signed form, which then keeps CONSENT_PURPOSE
    min_rows: int = 0
    # 0 no minimum: left out of the signed form; set, it is signed under
    # CONSENT_PURPOSE_MIN_OWN_ROWS (with min_rows beside it if that is set too)
    min_own_rows: int = 0
    # empty: any setting, left out of the signed form; set, it is signed (sorted by name)
    # under CONSENT_PURPOSE_SECURITIES, with the minimums beside it if they are set
    securities: frozenset[Security] = frozenset()

    def allows(self, security: Security) -> bool:
        """Whether a job in this security setting may rely on the consent."""
        return not self.securities or security in self.securities

    def to_bytes(self) -> bytes:
        if not (_SUBJECT.match(self.owner_id) and _SUBJECT.match(self.recipient)):
            raise ValueError("a consent names its owner and recipient by subject id "
                             "(letters, digits, '.', '_', '-')")
        if not _ID.match(self.dataset_id):
            raise ValueError("a consent names its data set by id")
        d: dict[str, str | int | list[str]] = {
            "purpose": CONSENT_PURPOSE, "owner_id": self.owner_id,
            "dataset_id": self.dataset_id, "recipient": self.recipient,
            "recipient_public_key": _b64(self.recipient_public_key),
            "reveal": self.reveal.value,
            "created_at": self.created_at or dt.datetime.now(dt.UTC).strftime(TIME_FORMAT),
        }
        if self.expires_at:
            utc_time(self.expires_at)  # ValueError on another form
            d["expires_at"] = self.expires_at
        if self.max_jobs:
            if not 0 < self.max_jobs <= MAX_CONSENT_JOBS:
                raise ValueError(f"a consent allows 1 to {MAX_CONSENT_JOBS} jobs")
            d["max_jobs"] = self.max_jobs
        if type(self.min_rows) is not int or not (
                self.min_rows == 0 or MIN_CONSENT_ROWS <= self.min_rows <= MAX_CONSENT_ROWS):
            raise ValueError(f"a consent asks for {MIN_CONSENT_ROWS} to {MAX_CONSENT_ROWS} "
                             "rows at least")
        if type(self.min_own_rows) is not int or not (
                self.min_own_rows == 0
                or MIN_CONSENT_ROWS <= self.min_own_rows <= MAX_CONSENT_ROWS):
            raise ValueError(f"a consent asks for {MIN_CONSENT_ROWS} to {MAX_CONSENT_ROWS} "
                             "rows of its owner's own uploads at least")
        if self.min_rows:
            d["purpose"] = CONSENT_PURPOSE_MIN_ROWS
            d["min_rows"] = self.min_rows
        if self.min_own_rows:
            d["purpose"] = CONSENT_PURPOSE_MIN_OWN_ROWS
            d["min_own_rows"] = self.min_own_rows
        if not isinstance(self.securities, frozenset) or not all(
                isinstance(s, Security) for s in self.securities):
            raise ValueError("a consent names the security settings it allows as a set of "
                             "ppfs security settings")
        if self.securities:
            d["purpose"] = CONSENT_PURPOSE_SECURITIES
            d["securities"] = sorted(s.value for s in self.securities)
        return _canonical(d)

    @classmethod
    def from_bytes(cls, blob: bytes) -> Consent:
        """The consent a statement states; ConsentError unless it is one: at most
        MAX_CONSENT_BYTES, owner and recipient subject ids, a data set id."""
        try:
            if len(blob) > MAX_CONSENT_BYTES:
                raise ValueError
            d = json.loads(blob)

            def rows(name: str) -> int:
                n = d[name]
                if type(n) is not int or not MIN_CONSENT_ROWS <= n <= MAX_CONSENT_ROWS:
                    raise ValueError
                return int(n)

            # a limit the purpose does not state: not one a party would skip
            securities: frozenset[Security] = frozenset()
            if d["purpose"] == CONSENT_PURPOSE:
                if "min_rows" in d or "min_own_rows" in d or "securities" in d:
                    raise ValueError
                min_rows = min_own_rows = 0
            elif d["purpose"] == CONSENT_PURPOSE_MIN_ROWS:
                if "min_own_rows" in d or "securities" in d:
                    raise ValueError
                min_rows, min_own_rows = rows("min_rows"), 0
            elif d["purpose"] == CONSENT_PURPOSE_MIN_OWN_ROWS:
                if "securities" in d:
                    raise ValueError
                min_rows = rows("min_rows") if "min_rows" in d else 0
                min_own_rows = rows("min_own_rows")
            elif d["purpose"] == CONSENT_PURPOSE_SECURITIES:
                min_rows = rows("min_rows") if "min_rows" in d else 0
                min_own_rows = rows("min_own_rows") if "min_own_rows" in d else 0
                named = d["securities"]
                # settings this version knows, each once, at least one
                if (type(named) is not list or not named
                        or not all(type(s) is str for s in named)
                        or len(set(named)) != len(named)):
                    raise ValueError
                securities = frozenset(Security(s) for s in named)
            else:
                raise ValueError
            key = base64.b64decode(d["recipient_public_key"], validate=True)
            if len(key) != 32:
                raise ValueError
            expires = str(d.get("expires_at", ""))
            if expires:
                utc_time(expires)
            max_jobs = d.get("max_jobs", 0)
            if type(max_jobs) is not int or not 0 <= max_jobs <= MAX_CONSENT_JOBS:
                raise ValueError
            if not (_SUBJECT.match(d["owner_id"]) and _SUBJECT.match(d["recipient"])
                    and _ID.match(d["dataset_id"])):
                raise ValueError
            return cls(str(d["owner_id"]), str(d["dataset_id"]), str(d["recipient"]), key,
                       Reveal(d["reveal"]), str(d["created_at"]), expires, max_jobs,
                       min_rows, min_own_rows, securities)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise ConsentError("a consent statement is malformed") from None

    def expired(self, now: dt.datetime | None = None) -> bool:
        return bool(self.expires_at) and utc_time(self.expires_at) <= (
            now or dt.datetime.now(dt.UTC))

    def sign(self, key: SigningKey) -> SignedConsent:
        blob = self.to_bytes()
        return SignedConsent(blob, key.sign(blob).signature)


@dataclass(frozen=True)
class SignedConsent:
    statement: bytes
    signature: bytes

    @property
    def consent(self) -> Consent:
        return Consent.from_bytes(self.statement)

    @property
    def digest(self) -> str:
        """What a party counts a limited consent's jobs under (SHA-256 of the statement)."""
        return hashlib.sha256(self.statement).hexdigest()

    def verify(self, owner_key: bytes) -> Consent:
        try:
            VerifyKey(owner_key).verify(self.statement, self.signature)
        except (BadSignatureError, ValueError):
            raise ConsentError("a consent is not signed by the owner it names") from None
        return self.consent


def check_consents(
    job: JobContract, upload_owners: Mapping[str, Sequence[str]], owner_keys: Mapping[str, bytes],
    mask_owner: str, mask_recipient_key: bytes, used: Mapping[str, int] | None = None,
    revoked: Callable[[Consent], bool] | None = None, *, rows: Mapping[str, int] | None = None,
    own_rows: Mapping[tuple[str, str], int] | None = None,
) -> list[str]:
    """A party's own authorisation of a job: for every data set, every owner of a
    pinned upload (``upload_owners``: data set id -> owner ids, from the manifests the
    party verified) signed a consent (key from ``owner_keys``, the party's registered
    owners) for this data set, the job's recipient and key, revealing at least what
    the job reveals, neither expired nor spent; and the mask upload was made by that
    recipient for that key. ConsentError naming what is missing otherwise.

    ``used`` counts the jobs this party accepted under each limited consent (by
    :attr:`SignedConsent.digest`). An owner's consent without a limit is relied on
    first; otherwise one of its limited consents with a job left (the lowest digest).
    Returns the digests of the limited consents the job spends, one per owner and data
    set that needs one: the caller records them with the job it accepts. A consent
    ``revoked`` selects (its owner revoked it, :class:`ppfs.withdrawal.Revocation`)
    counts for nothing.

    ``rows`` gives the rows the job pins of each data set, as this party counted them
    from the owner-signed manifests it verified (never a number the description
    states): a consent asking for more (:attr:`Consent.min_rows`) counts for nothing, a
    data set missing from ``rows`` counting as none. ``own_rows`` gives, for each owner
    id and data set id, the rows the job pins of that data set from uploads whose
    manifest that owner signed, counted alike: a consent asking for more of its owner's
    own rows (:attr:`Consent.min_own_rows`) counts for nothing, an owner and data set
    missing from ``own_rows`` counting as none. A consent short of either minimum is
    named with each minimum it misses (the least of the owner's consents), as more rows
    pinned would serve it. A consent that does not allow the job's security setting
    (:attr:`Consent.securities`, as the job's description states the setting) counts
    for nothing either, and is named with the settings it allows; the job is refused
    too for carrying it beside one that serves (:func:`unrelied_consent`)."""
    if not job.recipient:
        raise ConsentError("the job names no recipient")
    if mask_owner != job.recipient or mask_recipient_key != job.recipient_public_key:
        raise ConsentError(
            f"the mask upload was not made by the recipient {job.recipient!r} for the job's "
            "recipient key"
        )
    used = used or {}
    valid: set[tuple[str, str]] = set()  # without a limit
    limited: dict[tuple[str, str], list[str]] = {}  # digests with a job left
    expired: set[tuple[str, str]] = set()
    withdrawn: set[tuple[str, str]] = set()  # revoked by its owner
    spent: dict[tuple[str, str], int] = {}  # its limit, all used
    short: dict[tuple[str, str], int] = {}  # the least minimum of rows the job misses
    short_own: dict[tuple[str, str], int] = {}  # the same, of the owner's own rows
    # the settings the owner's consents allow, none of them the job's
    other_settings: dict[tuple[str, str], set[Security]] = {}
    pinned = rows or {}
    pinned_own = own_rows or {}
    for sc in dict.fromkeys(job.consents):  # one consent relayed many times counts once
        c = sc.consent
        key = owner_keys.get(c.owner_id)
        # one that could not serve this job is not verified: a signature check each for
        # thousands of them relayed would hold the party (the caller refuses them)
        if key is None or (c.recipient, c.recipient_public_key) != (
                job.recipient, job.recipient_public_key) \
                or not c.reveal.covers(job.training is not None):
            continue
        sc.verify(key)
        who = (c.owner_id, c.dataset_id)
        few = bool(c.min_rows) and pinned.get(c.dataset_id, 0) < c.min_rows
        few_own = bool(c.min_own_rows) and pinned_own.get(who, 0) < c.min_own_rows
        if revoked is not None and revoked(c):
            withdrawn.add(who)
        elif c.expired():
            expired.add(who)
        elif c.max_jobs and used.get(sc.digest, 0) >= c.max_jobs:
            spent[who] = c.max_jobs
        elif not c.allows(job.security):
            # usable in another setting: named next to the rows, as another would serve
            other_settings.setdefault(who, set()).update(c.securities)
        elif few or few_own:
            # usable but for the rows: named first below, as more rows would serve
            if few:
                short[who] = min(short.get(who, c.min_rows), c.min_rows)
            if few_own:
                short_own[who] = min(short_own.get(who, c.min_own_rows), c.min_own_rows)
        elif not c.max_jobs:
            valid.add(who)
        else:
            limited.setdefault(who, []).append(sc.digest)

    def why(who: tuple[str, str]) -> str:
        # a consent usable but for the rows: more rows pinned would serve, the rest not
        if who in short or who in short_own:
            return "".join((
                f" (its consent asks for at least {short[who]} rows; the job pins "
                f"{pinned.get(who[1], 0)})" if who in short else "",
                f" (its consent asks for at least {short_own[who]} rows of the owner's own "
                f"uploads; the job pins {pinned_own.get(who, 0)} of them)"
                if who in short_own else ""))
        if who in other_settings:
            allowed = ", ".join(sorted(s.value for s in other_settings[who]))
            return (f" (its consent does not allow the security setting {job.security.value}; "
                    f"it allows {allowed})")
        if who in spent:
            n = spent[who]
            return f" (its consent allows {n} job{'s' if n > 1 else ''}, all used)"
        if who in expired:
            return " (its consent has expired)"
        return " (its owner revoked its consent)" if who in withdrawn else ""

    needed = [(o, ds) for ds, owners in upload_owners.items() for o in sorted(set(owners))]
    missing = [f"{o!r} for data set {ds!r}{why((o, ds))}" for o, ds in needed
               if (o, ds) not in valid and (o, ds) not in limited]
    if missing:
        what = "the selection and model" if job.training is not None else "the selection"
        raise ConsentError(
            f"no consent to reveal {what} to {job.recipient!r} from owner "
            + "; ".join(missing)[:400]
        )
    return [min(limited[who]) for who in needed if who not in valid]


def unrelied_consent(job: JobContract, upload_owners: Mapping[str, Sequence[str]]
                     ) -> str | None:
    """Why one of the consents the job carries is none it can rely on, or None when each
    could serve it: for one of its data sets, from an owner of an upload it pins of that
    data set (``upload_owners``, as in :func:`check_consents`), to its recipient and
    result key, allowing what it reveals and its security setting. A gateway relays no
    other (it holds every consent it was ever given, to other recipients and for other
    data sets); a party keeps a job's consents with its record."""
    for sc in job.consents:
        c = sc.consent
        if c.dataset_id not in upload_owners:
            why = "a data set the job does not name"
        elif c.owner_id not in upload_owners[c.dataset_id]:
            why = "its owner has no upload the job pins of that data set"
        elif c.recipient != job.recipient:
            why = "another recipient"
        elif c.recipient_public_key != job.recipient_public_key:
            why = "for another result key"
        elif not c.reveal.covers(job.training is not None):
            why = "it does not allow the model the job trains"
        elif not c.allows(job.security):
            # static in the job's description like what it reveals: a gateway can tell,
            # and relays none (padding that could never serve, whatever else is carried)
            why = f"it does not allow the security setting {job.security.value}"
        else:
            continue
        return (f"the job carries a consent of {c.owner_id!r} for data set {c.dataset_id!r} "
                f"to {c.recipient!r} that it cannot rely on ({why})")
    return None


class RequestError(ParameterError):
    """A job's parameters are not the ones its recipient signed."""


@dataclass(frozen=True)
class JobRequest:
    """What the recipient asked for, signed with its registered key: every party runs a
    job only as requested (the gateway, which fills in the rest, cannot change the
    security setting, the engine, the scorer, the data sets or how they are combined,
    k or the training parameters). The data sets are named in order (the order in which
    they are combined)."""

    recipient: str
    recipient_public_key: bytes
    mask_upload_id: str
    dataset_ids: tuple[str, ...]
    combination: str
    label_column: str
    k: int
    security: str
    engine: str
    scorer: str
    training: Mapping[str, Any] | None

    @classmethod
    def for_job(cls, job: JobContract) -> JobRequest:
        """The request a job fulfils."""
        return cls(job.recipient, job.recipient_public_key, job.mask_upload_id,
                   job.dataset_ids, job.combination.value, job.label_column, job.k,
                   job.security.value, job.engine, job.scorer.value,
                   training_body(job.training))

    def to_bytes(self) -> bytes:
        return _canonical({
            "purpose": REQUEST_PURPOSE, "recipient": self.recipient,
            "recipient_public_key": _b64(self.recipient_public_key),
            "mask_upload_id": self.mask_upload_id, "dataset_ids": list(self.dataset_ids),
            "combination": self.combination, "label_column": self.label_column,
            "k": self.k, "security": self.security, "engine": self.engine,
            "scorer": self.scorer, "training": self.training,
        })

    def sign(self, key: SigningKey) -> SignedRequest:
        blob = self.to_bytes()
        return SignedRequest(blob, key.sign(blob).signature)


@dataclass(frozen=True)
class SignedRequest:
    statement: bytes
    signature: bytes


def check_request(job: JobContract, recipient_key: bytes | None) -> None:
    """A party's own check that the job is what its recipient asked for: the request it
    carries is signed by the recipient's registered key (``recipient_key``, None when
    the recipient is not registered with this party) and states exactly this job's
    parameters. RequestError naming the difference otherwise."""
    if job.request is None:
        raise RequestError("the job carries no request signed by its recipient")
    if recipient_key is None:
        raise RequestError(f"the recipient {job.recipient!r} is not registered with this party")
    try:
        VerifyKey(recipient_key).verify(job.request.statement, job.request.signature)
    except (BadSignatureError, ValueError):
        raise RequestError(
            f"the job's request is not signed by its recipient {job.recipient!r}") from None
    try:
        asked = json.loads(job.request.statement)
    except ValueError:
        raise RequestError("the job's request is malformed") from None
    runs = json.loads(JobRequest.for_job(job).to_bytes())
    if not isinstance(asked, dict) or asked.get("purpose") != REQUEST_PURPOSE:
        raise RequestError("the job's request is malformed")
    differ = sorted(f for f in runs.keys() | asked.keys() if runs.get(f) != asked.get(f))
    if differ:
        raise RequestError("the job differs from what its recipient asked for in: "
                           + ", ".join(differ)[:300])


@dataclass(frozen=True)
class JobContract:
    """One job, fully stated. Build with :meth:`planned` or :meth:`from_proto`."""

    job_id: str
    datasets: tuple[PinnedDataset, ...]
    combination: Combination
    label_column: str
    k: int
    security: Security
    engine: str
    frac_bits: int
    recipient_public_key: bytes
    mask_upload_id: str
    m: int
    p: int
    classes: int
    training: TrainParams | None = None
    peer_mpc_addresses: tuple[str, ...] = ()
    consents: tuple[SignedConsent, ...] = ()
    recipient: str = ""  # the recipient's subject
    scorer: Scorer = Scorer.MS_GINI
    request: SignedRequest | None = None  # the recipient's, signed (JobRequest)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ParameterError(f"unknown engine {self.engine!r}; choose one of "
                                 f"{', '.join(ENGINES)}")
        if not self.datasets:
            raise ParameterError("the job names no data set")
        for ds in self.datasets:
            if not ds.uploads:
                raise ParameterError(f"the job pins no upload of data set {ds.dataset_id!r}")
        if len(self.recipient_public_key) != 32:
            raise ParameterError("the recipient's public key must be a 32-byte X25519 key")
        if not self.mask_upload_id:
            raise ParameterError("the job names no mask upload")
        if not 0 <= self.frac_bits <= MAX_FRAC_BITS:
            raise ParameterError(f"fractional bits must be in [0, {MAX_FRAC_BITS}], "
                                 f"got {self.frac_bits}")
        self.shape  # noqa: B018 -- ParameterError on an impossible shape

    @property
    def shape(self) -> Step2AShape:
        fp = FixedPoint(frac_bits=self.frac_bits)
        return service_shape(self.m, self.p, self.classes, self.k, fp.value_bits, self.training,
                             self.scorer)

    @property
    def outputs(self) -> int:
        return self.shape.outputs

    @property
    def dataset_ids(self) -> tuple[str, ...]:
        return tuple(d.dataset_id for d in self.datasets)

    @property
    def upload_ids(self) -> tuple[str, ...]:
        return tuple(u.upload_id for d in self.datasets for u in d.uploads)

    # -- wire form ----------------------------------------------------------------

    def to_proto(self) -> pb.JobDescription:
        desc = pb.JobDescription(
            job_id=self.job_id,
            dataset_ids=list(self.dataset_ids),
            combination=self.combination.to_proto(),
            label_column=self.label_column,
            k=self.k,
            security=self.security.value,
            engine=self.engine,
            frac_bits=self.frac_bits,
            recipient_public_key=self.recipient_public_key,
            mask_upload_id=self.mask_upload_id,
            peer_mpc_addresses=list(self.peer_mpc_addresses),
            datasets=[
                pb.PinnedDataset(dataset_id=d.dataset_id, uploads=[
                    pb.PinnedUpload(upload_id=u.upload_id, manifest_sha256=u.manifest_sha256,
                                    rows=u.rows) for u in d.uploads])
                for d in self.datasets
            ],
            m=self.m, p=self.p, classes=self.classes, outputs=self.outputs,
            contract_version=CONTRACT_VERSION,
            consents=[pb.OwnerConsent(statement=c.statement, signature=c.signature)
                      for c in self.consents],
            recipient=self.recipient,
            scorer=self.scorer.value,
        )
        if self.request is not None:
            desc.request.CopyFrom(pb.RecipientRequest(statement=self.request.statement,
                                                      signature=self.request.signature))
        if self.training is not None:
            t = self.training
            desc.training.CopyFrom(pb.TrainingParameters(
                epochs=t.epochs, batch_size=t.batch, learning_rate=t.lr, seed=t.seed,
                frac_bits=t.frac_bits, sigmoid=t.sigmoid, weight_bits=t.weight_bits,
            ))
        return desc

    @classmethod
    def from_proto(cls, desc: pb.JobDescription, *,
                   versions: Sequence[int] = (CONTRACT_VERSION,)) -> JobContract:
        """The contract a description states; ParameterError when it is incomplete or
        inconsistent (a description from an older gateway lacks the pinned inputs) or
        of a version not in ``versions``."""
        if desc.contract_version not in versions:
            raise ParameterError(
                f"job contract version {desc.contract_version} is not {CONTRACT_VERSION}"
            )
        try:
            security = Security(desc.security)
        except ValueError:
            raise ParameterError(f"unknown security setting {desc.security!r}") from None
        if desc.combination == pb.COMBINATION_UNSPECIFIED:
            raise ParameterError("the job names no combination (horizontal or vertical)")
        if desc.combination not in pb.Combination.values():  # an open enum: any number parses
            raise ParameterError(f"unknown combination {desc.combination}; horizontal or "
                                 "vertical")
        combination = Combination[pb.Combination.Name(desc.combination).removeprefix(
            "COMBINATION_")]
        datasets = tuple(
            PinnedDataset(d.dataset_id, tuple(
                PinnedUpload(u.upload_id, u.manifest_sha256, u.rows) for u in d.uploads))
            for d in desc.datasets
        )
        if tuple(d.dataset_id for d in datasets) != tuple(desc.dataset_ids):
            raise ParameterError("the job's data set ids and pinned data sets differ")
        training = None
        if desc.HasField("training"):
            t = desc.training
            training = TrainParams(epochs=t.epochs, batch=t.batch_size, lr=t.learning_rate,
                                   seed=t.seed, frac_bits=t.frac_bits, sigmoid=t.sigmoid,
                                   weight_bits=t.weight_bits)
        job = cls(
            job_id=desc.job_id, datasets=datasets, combination=combination,
            label_column=desc.label_column, k=desc.k, security=security, engine=desc.engine,
            frac_bits=desc.frac_bits, recipient_public_key=desc.recipient_public_key,
            mask_upload_id=desc.mask_upload_id, m=desc.m, p=desc.p, classes=desc.classes,
            training=training, peer_mpc_addresses=tuple(desc.peer_mpc_addresses),
            consents=tuple(SignedConsent(c.statement, c.signature) for c in desc.consents),
            recipient=desc.recipient,
            scorer=parse_scorer(desc.scorer),
            request=(SignedRequest(desc.request.statement, desc.request.signature)
                     if desc.HasField("request") else None),
        )
        if job.outputs != desc.outputs:
            raise ParameterError(
                f"the job says it opens {desc.outputs} words; its shape opens {job.outputs}"
            )
        return job

    def sha256(self) -> str:
        return description_sha256(self.to_proto())

    def session_tag(self, sha256: str | None = None) -> int:
        """252 bits of SHA-256(job_id || description SHA-256): every engine party inputs
        it first (in words of 63 bits) and the run stops unless all parties input the
        same tag."""
        return session_tag(self.job_id, sha256 or self.sha256())


def description_sha256(desc: pb.JobDescription) -> str:
    """SHA-256 of the description's deterministic protobuf encoding."""
    return hashlib.sha256(desc.SerializeToString(deterministic=True)).hexdigest()


def session_tag(job_id: str, description_sha256: str) -> int:
    digest = hashlib.sha256(
        b"ppfs session\0" + job_id.encode() + b"\0" + description_sha256.encode()
    ).digest()
    return int.from_bytes(digest, "big") >> (256 - SESSION_TAG_BITS)


# -- result parts ------------------------------------------------------------------


def seal_result(
    job_id: str, words: np.ndarray, recipient: bytes, signer: SigningKey
) -> tuple[bytes, bytes]:
    """(sealed, signature) as a party puts them in SealedResultPart."""
    blob = np.ascontiguousarray(words, dtype="<u8").tobytes()
    sealed = SealedBox(PublicKey(recipient)).encrypt(blob)
    return sealed, signer.sign(job_id.encode() + sealed).signature


def open_result(
    job_id: str, sealed: bytes, signature: bytes, party_key: bytes, recipient: PrivateKey
) -> np.ndarray:
    """Check the party's signature over job_id || sealed, open with the recipient's key."""
    try:
        VerifyKey(party_key).verify(job_id.encode() + sealed, signature)
    except (BadSignatureError, ValueError):
        raise ShareFormatError("a result part is not signed by its party for this job") from None
    try:
        blob = SealedBox(recipient).decrypt(sealed)
    except CryptoError:
        raise ShareFormatError("a result part cannot be opened with this recipient key") from None
    if len(blob) % 8:
        raise ShareFormatError("a result part does not hold whole 64-bit words")
    return np.frombuffer(blob, dtype="<u8").astype(np.uint64)


def training_body(t: TrainParams | None) -> dict[str, Any] | None:
    """Step 2B's parameters as a JSON object (the inverse of training_from_body)."""
    if t is None:
        return None
    return {"epochs": t.epochs, "batch_size": t.batch, "learning_rate": t.lr, "seed": t.seed,
            "frac_bits": t.frac_bits, "sigmoid": t.sigmoid, "weight_bits": t.weight_bits}


class ResultRejected(ShareFormatError):
    """The recipient refuses a job's result (parts missing, repeated, forged or
    disagreeing, or a gateway record that differs from what the parties signed)."""


@dataclass(frozen=True)
class ResultStatement:
    """What one party states about its result part. Everything but ``party_index`` and
    ``sealed_sha256`` must be the same in every party's statement."""

    job_id: str
    description_sha256: str
    party_index: int
    sealed_sha256: str
    recipient: str
    recipient_public_key: str  # base64
    mask_upload_id: str
    dataset_ids: tuple[str, ...]
    m: int
    p: int
    k: int
    columns: tuple[str, ...]
    column_exponents: tuple[int, ...]
    classes: tuple[str, ...]
    frac_bits: int
    outputs: int
    training: Mapping[str, Any] | None
    # SHA-256 of the recipient's signed request (JobRequest) the job ran for: the recipient
    # checks it against the request it kept, so no result answers another request
    request_sha256: str = ""

    @classmethod
    def for_job(cls, job: JobContract, sha256: str, party_index: int, sealed: bytes,
                verified: Plan) -> ResultStatement:
        """The statement of a party that verified the job's manifests into ``verified``."""
        return cls(
            job_id=job.job_id, description_sha256=sha256, party_index=party_index,
            sealed_sha256=hashlib.sha256(sealed).hexdigest(), recipient=job.recipient,
            recipient_public_key=_b64(job.recipient_public_key),
            mask_upload_id=job.mask_upload_id, dataset_ids=job.dataset_ids, m=job.m, p=job.p,
            k=job.k, columns=verified.columns, column_exponents=verified.column_exponents,
            classes=verified.classes, frac_bits=job.frac_bits, outputs=job.outputs,
            training=training_body(job.training),
            request_sha256=(hashlib.sha256(job.request.statement).hexdigest()
                            if job.request is not None else ""),
        )

    def to_bytes(self) -> bytes:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return _canonical({"purpose": RESULT_PURPOSE, **d})

    @classmethod
    def from_bytes(cls, blob: bytes) -> ResultStatement:
        try:
            d = json.loads(blob)
            if d.pop("purpose") != RESULT_PURPOSE:
                raise ValueError
            for f in ("dataset_ids", "columns", "column_exponents", "classes"):
                d[f] = tuple(d[f])
            return cls(**d)
        except (ValueError, KeyError, TypeError):
            raise ResultRejected("a result statement is malformed") from None

    def decoding(self) -> dict[str, Any]:
        """The fields every party must state alike."""
        d = json.loads(self.to_bytes())
        del d["party_index"], d["sealed_sha256"]
        return dict(d)

    def sign(self, signer: SigningKey) -> tuple[bytes, bytes]:
        blob = self.to_bytes()
        return blob, signer.sign(blob).signature


def open_result_statement(
    job_id: str, party_index: int, sealed: bytes, statement: bytes, signature: bytes,
    party_key: bytes, party_name: str,
) -> ResultStatement:
    """A party's signed statement about its part, checked against the part."""
    if not statement:
        raise ResultRejected(f"{party_name}'s result part carries no signed statement")
    try:
        VerifyKey(party_key).verify(statement, signature)
    except (BadSignatureError, ValueError):
        raise ResultRejected(
            f"{party_name}'s result statement is not signed by {party_name}'s certified key"
        ) from None
    st = ResultStatement.from_bytes(statement)
    if (st.job_id, st.party_index) != (job_id, party_index):
        raise ResultRejected(f"{party_name}'s result statement is for another job or party")
    if st.sealed_sha256 != hashlib.sha256(sealed).hexdigest():
        raise ResultRejected(f"{party_name}'s result statement names another sealed part")
    return st
