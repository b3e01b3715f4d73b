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

Later parts of the contract (owner consents, certified party keys) are further
fields of :class:`JobContract` and of ``JobDescription`` (numbers 19-29 are free).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
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
    SessionMismatchError,
    ShareFormatError,
    TimedOutError,
)
from ppfs.fixedpoint import FixedPoint
from ppfs.scoring import SCORER_NAMES, Scorer
from ppfs.step2a import Security, Step2AShape
from ppfs.step2b import TrainParams
from ppfs.v1 import party_pb2 as pb

CONTRACT_VERSION = 1
ENGINES = ("mp-spdz", "mpyc")
SESSION_TAG_BITS = 63


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
    INTEGRITY = "integrity"  # copies of a share component disagree
    REFUSED = "refused"  # parameters or pinned inputs not acceptable to the party
    CANCELLED = "cancelled"  # told to stop
    SESSION = "session"  # the engine's peers ran another job
    RESTARTED = "restarted"  # the party restarted while the job was unfinished

    @property
    def symptom(self) -> bool:
        """True when the kind only reports that something happened elsewhere."""
        return self in (FailureKind.PEER_LOST, FailureKind.SESSION, FailureKind.CANCELLED)

    def to_proto(self) -> pb.FailureKind:
        return cast("pb.FailureKind", pb.FailureKind.Value(f"FAILURE_KIND_{self.name}"))

    @classmethod
    def from_proto(cls, value: int) -> FailureKind | None:
        name = pb.FailureKind.Name(value).removeprefix("FAILURE_KIND_")
        return None if name == "UNSPECIFIED" else cls[name]


def failure_kind(exc: BaseException) -> FailureKind:
    """The kind of a failure raised while running a job."""
    if isinstance(exc, IntegrityError):
        return FailureKind.INTEGRITY
    if isinstance(exc, SessionMismatchError):
        return FailureKind.SESSION
    if isinstance(exc, PeerLostError):
        return FailureKind.PEER_LOST
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
    scorer: Scorer = Scorer.MS_GINI

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
            scorer=self.scorer.value,
        )
        if self.training is not None:
            t = self.training
            desc.training.CopyFrom(pb.TrainingParameters(
                epochs=t.epochs, batch_size=t.batch, learning_rate=t.lr, seed=t.seed,
                frac_bits=t.frac_bits, sigmoid=t.sigmoid, weight_bits=t.weight_bits,
            ))
        return desc

    @classmethod
    def from_proto(cls, desc: pb.JobDescription) -> JobContract:
        """The contract a description states; ParameterError when it is incomplete or
        inconsistent (a description from an older gateway lacks the pinned inputs)."""
        if desc.contract_version != CONTRACT_VERSION:
            raise ParameterError(
                f"job contract version {desc.contract_version} is not {CONTRACT_VERSION}"
            )
        try:
            security = Security(desc.security)
        except ValueError:
            raise ParameterError(f"unknown security setting {desc.security!r}") from None
        if desc.combination == pb.COMBINATION_UNSPECIFIED:
            raise ParameterError("the job names no combination (horizontal or vertical)")
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
            scorer=parse_scorer(desc.scorer),
        )
        if job.outputs != desc.outputs:
            raise ParameterError(
                f"the job says it opens {desc.outputs} words; its shape opens {job.outputs}"
            )
        return job

    def sha256(self) -> str:
        return description_sha256(self.to_proto())

    def session_tag(self, sha256: str | None = None) -> int:
        """63 bits of SHA-256(job_id || description SHA-256): every engine party inputs
        it first and the run stops unless all parties input the same tag."""
        return session_tag(self.job_id, sha256 or self.sha256())


def description_sha256(desc: pb.JobDescription) -> str:
    """SHA-256 of the description's deterministic protobuf encoding."""
    return hashlib.sha256(desc.SerializeToString(deterministic=True)).hexdigest()


def session_tag(job_id: str, description_sha256: str) -> int:
    digest = hashlib.sha256(
        b"ppfs session\0" + job_id.encode() + b"\0" + description_sha256.encode()
    ).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SESSION_TAG_BITS)


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
