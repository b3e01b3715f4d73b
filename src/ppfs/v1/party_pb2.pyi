from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UploadStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPLOAD_STATUS_UNSPECIFIED: _ClassVar[UploadStatus]
    UPLOAD_STATUS_STAGED: _ClassVar[UploadStatus]
    UPLOAD_STATUS_COMMITTED: _ClassVar[UploadStatus]
    UPLOAD_STATUS_ABORTED: _ClassVar[UploadStatus]
    UPLOAD_STATUS_DAMAGED: _ClassVar[UploadStatus]

class Combination(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMBINATION_UNSPECIFIED: _ClassVar[Combination]
    COMBINATION_HORIZONTAL: _ClassVar[Combination]
    COMBINATION_VERTICAL: _ClassVar[Combination]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class FailureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_KIND_UNSPECIFIED: _ClassVar[FailureKind]
    FAILURE_KIND_OWN: _ClassVar[FailureKind]
    FAILURE_KIND_PEER_LOST: _ClassVar[FailureKind]
    FAILURE_KIND_TIMEOUT: _ClassVar[FailureKind]
    FAILURE_KIND_INTEGRITY: _ClassVar[FailureKind]
    FAILURE_KIND_REFUSED: _ClassVar[FailureKind]
    FAILURE_KIND_CANCELLED: _ClassVar[FailureKind]
    FAILURE_KIND_SESSION: _ClassVar[FailureKind]
    FAILURE_KIND_RESTARTED: _ClassVar[FailureKind]
    FAILURE_KIND_OUT_OF_RANGE: _ClassVar[FailureKind]
    FAILURE_KIND_STALLED: _ClassVar[FailureKind]
UPLOAD_STATUS_UNSPECIFIED: UploadStatus
UPLOAD_STATUS_STAGED: UploadStatus
UPLOAD_STATUS_COMMITTED: UploadStatus
UPLOAD_STATUS_ABORTED: UploadStatus
UPLOAD_STATUS_DAMAGED: UploadStatus
COMBINATION_UNSPECIFIED: Combination
COMBINATION_HORIZONTAL: Combination
COMBINATION_VERTICAL: Combination
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
FAILURE_KIND_UNSPECIFIED: FailureKind
FAILURE_KIND_OWN: FailureKind
FAILURE_KIND_PEER_LOST: FailureKind
FAILURE_KIND_TIMEOUT: FailureKind
FAILURE_KIND_INTEGRITY: FailureKind
FAILURE_KIND_REFUSED: FailureKind
FAILURE_KIND_CANCELLED: FailureKind
FAILURE_KIND_SESSION: FailureKind
FAILURE_KIND_RESTARTED: FailureKind
FAILURE_KIND_OUT_OF_RANGE: FailureKind
FAILURE_KIND_STALLED: FailureKind

class GetIdentityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartyIdentity(_message.Message):
    __slots__ = ("index", "name", "box_public_key", "signing_public_key", "tls_certificate_pem", "mpc_certificate_pem", "engines", "mpc_host", "mpc_port_base", "mpc_port_count", "key_statement", "key_statement_signature", "deployment_ca_pem", "software_version", "engine_versions", "stopping", "stop_seconds_left")
    class EngineVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BOX_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNING_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    TLS_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    MPC_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    MPC_HOST_FIELD_NUMBER: _ClassVar[int]
    MPC_PORT_BASE_FIELD_NUMBER: _ClassVar[int]
    MPC_PORT_COUNT_FIELD_NUMBER: _ClassVar[int]
    KEY_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    KEY_STATEMENT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_CA_PEM_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    STOP_SECONDS_LEFT_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    box_public_key: bytes
    signing_public_key: bytes
    tls_certificate_pem: bytes
    mpc_certificate_pem: bytes
    engines: _containers.RepeatedScalarFieldContainer[str]
    mpc_host: str
    mpc_port_base: int
    mpc_port_count: int
    key_statement: bytes
    key_statement_signature: bytes
    deployment_ca_pem: bytes
    software_version: str
    engine_versions: _containers.ScalarMap[str, str]
    stopping: bool
    stop_seconds_left: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., box_public_key: _Optional[bytes] = ..., signing_public_key: _Optional[bytes] = ..., tls_certificate_pem: _Optional[bytes] = ..., mpc_certificate_pem: _Optional[bytes] = ..., engines: _Optional[_Iterable[str]] = ..., mpc_host: _Optional[str] = ..., mpc_port_base: _Optional[int] = ..., mpc_port_count: _Optional[int] = ..., key_statement: _Optional[bytes] = ..., key_statement_signature: _Optional[bytes] = ..., deployment_ca_pem: _Optional[bytes] = ..., software_version: _Optional[str] = ..., engine_versions: _Optional[_Mapping[str, str]] = ..., stopping: _Optional[bool] = ..., stop_seconds_left: _Optional[int] = ...) -> None: ...

class UploadPartHeader(_message.Message):
    __slots__ = ("dataset_id", "upload_id", "owner_id", "manifest", "manifest_signature", "sealed_size", "staged", "repair", "repair_signature")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SEALED_SIZE_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    REPAIR_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    upload_id: str
    owner_id: str
    manifest: bytes
    manifest_signature: bytes
    sealed_size: int
    staged: bool
    repair: bytes
    repair_signature: bytes
    def __init__(self, dataset_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., manifest: _Optional[bytes] = ..., manifest_signature: _Optional[bytes] = ..., sealed_size: _Optional[int] = ..., staged: _Optional[bool] = ..., repair: _Optional[bytes] = ..., repair_signature: _Optional[bytes] = ...) -> None: ...

class UploadPartChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UploadPartHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[UploadPartHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class PutUploadPartResponse(_message.Message):
    __slots__ = ("dataset_id", "upload_id", "rows", "columns")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    upload_id: str
    rows: int
    columns: int
    def __init__(self, dataset_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., rows: _Optional[int] = ..., columns: _Optional[int] = ...) -> None: ...

class GetDatasetRequest(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class DatasetInfo(_message.Message):
    __slots__ = ("dataset_id", "columns", "column_exponents", "label_column", "classes", "rows", "upload_ids")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COLUMN_EXPONENTS_FIELD_NUMBER: _ClassVar[int]
    LABEL_COLUMN_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_IDS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    column_exponents: _containers.RepeatedScalarFieldContainer[int]
    label_column: str
    classes: int
    rows: int
    upload_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dataset_id: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., column_exponents: _Optional[_Iterable[int]] = ..., label_column: _Optional[str] = ..., classes: _Optional[int] = ..., rows: _Optional[int] = ..., upload_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UploadDecisionRequest(_message.Message):
    __slots__ = ("dataset_id", "upload_id")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    upload_id: str
    def __init__(self, dataset_id: _Optional[str] = ..., upload_id: _Optional[str] = ...) -> None: ...

class UploadDecisionResponse(_message.Message):
    __slots__ = ("upload_id", "status")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    status: UploadStatus
    def __init__(self, upload_id: _Optional[str] = ..., status: _Optional[_Union[UploadStatus, str]] = ...) -> None: ...

class ListUploadsRequest(_message.Message):
    __slots__ = ("dataset_id", "verify")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    verify: bool
    def __init__(self, dataset_id: _Optional[str] = ..., verify: _Optional[bool] = ...) -> None: ...

class HeldUpload(_message.Message):
    __slots__ = ("upload_id", "manifest_sha256", "rows", "status", "signed_at")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    manifest_sha256: str
    rows: int
    status: UploadStatus
    signed_at: str
    def __init__(self, upload_id: _Optional[str] = ..., manifest_sha256: _Optional[str] = ..., rows: _Optional[int] = ..., status: _Optional[_Union[UploadStatus, str]] = ..., signed_at: _Optional[str] = ...) -> None: ...

class ListUploadsResponse(_message.Message):
    __slots__ = ("dataset_id", "uploads")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOADS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    uploads: _containers.RepeatedCompositeFieldContainer[HeldUpload]
    def __init__(self, dataset_id: _Optional[str] = ..., uploads: _Optional[_Iterable[_Union[HeldUpload, _Mapping]]] = ...) -> None: ...

class PinnedUpload(_message.Message):
    __slots__ = ("upload_id", "manifest_sha256", "rows")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    manifest_sha256: str
    rows: int
    def __init__(self, upload_id: _Optional[str] = ..., manifest_sha256: _Optional[str] = ..., rows: _Optional[int] = ...) -> None: ...

class PinnedDataset(_message.Message):
    __slots__ = ("dataset_id", "uploads")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOADS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    uploads: _containers.RepeatedCompositeFieldContainer[PinnedUpload]
    def __init__(self, dataset_id: _Optional[str] = ..., uploads: _Optional[_Iterable[_Union[PinnedUpload, _Mapping]]] = ...) -> None: ...

class TrainingParameters(_message.Message):
    __slots__ = ("epochs", "batch_size", "learning_rate", "seed", "frac_bits", "sigmoid", "weight_bits")
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FRAC_BITS_FIELD_NUMBER: _ClassVar[int]
    SIGMOID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BITS_FIELD_NUMBER: _ClassVar[int]
    epochs: int
    batch_size: int
    learning_rate: float
    seed: int
    frac_bits: int
    sigmoid: str
    weight_bits: int
    def __init__(self, epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., seed: _Optional[int] = ..., frac_bits: _Optional[int] = ..., sigmoid: _Optional[str] = ..., weight_bits: _Optional[int] = ...) -> None: ...

class JobDescription(_message.Message):
    __slots__ = ("job_id", "dataset_ids", "combination", "label_column", "k", "security", "engine", "frac_bits", "training", "recipient_public_key", "mask_upload_id", "peer_mpc_addresses", "datasets", "m", "p", "classes", "outputs", "contract_version", "consents", "recipient", "request", "scorer")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_IDS_FIELD_NUMBER: _ClassVar[int]
    COMBINATION_FIELD_NUMBER: _ClassVar[int]
    LABEL_COLUMN_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FRAC_BITS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    MASK_UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_MPC_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONSENTS_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    SCORER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dataset_ids: _containers.RepeatedScalarFieldContainer[str]
    combination: Combination
    label_column: str
    k: int
    security: str
    engine: str
    frac_bits: int
    training: TrainingParameters
    recipient_public_key: bytes
    mask_upload_id: str
    peer_mpc_addresses: _containers.RepeatedScalarFieldContainer[str]
    datasets: _containers.RepeatedCompositeFieldContainer[PinnedDataset]
    m: int
    p: int
    classes: int
    outputs: int
    contract_version: int
    consents: _containers.RepeatedCompositeFieldContainer[OwnerConsent]
    recipient: str
    request: RecipientRequest
    scorer: str
    def __init__(self, job_id: _Optional[str] = ..., dataset_ids: _Optional[_Iterable[str]] = ..., combination: _Optional[_Union[Combination, str]] = ..., label_column: _Optional[str] = ..., k: _Optional[int] = ..., security: _Optional[str] = ..., engine: _Optional[str] = ..., frac_bits: _Optional[int] = ..., training: _Optional[_Union[TrainingParameters, _Mapping]] = ..., recipient_public_key: _Optional[bytes] = ..., mask_upload_id: _Optional[str] = ..., peer_mpc_addresses: _Optional[_Iterable[str]] = ..., datasets: _Optional[_Iterable[_Union[PinnedDataset, _Mapping]]] = ..., m: _Optional[int] = ..., p: _Optional[int] = ..., classes: _Optional[int] = ..., outputs: _Optional[int] = ..., contract_version: _Optional[int] = ..., consents: _Optional[_Iterable[_Union[OwnerConsent, _Mapping]]] = ..., recipient: _Optional[str] = ..., request: _Optional[_Union[RecipientRequest, _Mapping]] = ..., scorer: _Optional[str] = ...) -> None: ...

class OwnerConsent(_message.Message):
    __slots__ = ("statement", "signature")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class RecipientRequest(_message.Message):
    __slots__ = ("statement", "signature")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class StartJobRequest(_message.Message):
    __slots__ = ("job", "description_sha256")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_SHA256_FIELD_NUMBER: _ClassVar[int]
    job: JobDescription
    description_sha256: str
    def __init__(self, job: _Optional[_Union[JobDescription, _Mapping]] = ..., description_sha256: _Optional[str] = ...) -> None: ...

class StartJobResponse(_message.Message):
    __slots__ = ("job_id", "program_sha256", "state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_SHA256_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    program_sha256: str
    state: JobState
    def __init__(self, job_id: _Optional[str] = ..., program_sha256: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("state", "remembered")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REMEMBERED_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    remembered: bool
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., remembered: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "state", "phase", "progress", "error", "program_sha256", "seconds", "bytes_sent", "failure", "waited_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_SHA256_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    WAITED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: JobState
    phase: str
    progress: float
    error: str
    program_sha256: str
    seconds: float
    bytes_sent: int
    failure: FailureKind
    waited_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., phase: _Optional[str] = ..., progress: _Optional[float] = ..., error: _Optional[str] = ..., program_sha256: _Optional[str] = ..., seconds: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., failure: _Optional[_Union[FailureKind, str]] = ..., waited_seconds: _Optional[float] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    def __init__(self, status: _Optional[_Union[JobStatus, _Mapping]] = ...) -> None: ...

class FetchResultPartRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class SealedResultPart(_message.Message):
    __slots__ = ("job_id", "party_index", "sealed", "signature", "statement", "statement_signature")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    party_index: int
    sealed: bytes
    signature: bytes
    statement: bytes
    statement_signature: bytes
    def __init__(self, job_id: _Optional[str] = ..., party_index: _Optional[int] = ..., sealed: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., statement: _Optional[bytes] = ..., statement_signature: _Optional[bytes] = ...) -> None: ...

class WithdrawUploadsRequest(_message.Message):
    __slots__ = ("statement", "signature")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class WithdrawUploadsResponse(_message.Message):
    __slots__ = ("receipt", "receipt_signature")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    receipt: bytes
    receipt_signature: bytes
    def __init__(self, receipt: _Optional[bytes] = ..., receipt_signature: _Optional[bytes] = ...) -> None: ...

class RevokeConsentsRequest(_message.Message):
    __slots__ = ("statement", "signature")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class RevokeConsentsResponse(_message.Message):
    __slots__ = ("receipt", "receipt_signature")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    receipt: bytes
    receipt_signature: bytes
    def __init__(self, receipt: _Optional[bytes] = ..., receipt_signature: _Optional[bytes] = ...) -> None: ...

class StateHoldingsRequest(_message.Message):
    __slots__ = ("dataset_id", "owner_id", "challenge")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    owner_id: str
    challenge: bytes
    def __init__(self, dataset_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., challenge: _Optional[bytes] = ...) -> None: ...

class StateHoldingsResponse(_message.Message):
    __slots__ = ("statement", "signature")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...
