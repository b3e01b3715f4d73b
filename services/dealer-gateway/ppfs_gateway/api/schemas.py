"""Request and response bodies of the REST API (public metadata only)."""

from __future__ import annotations

import base64
import binascii
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ppfs_gateway.errors import MalformedUpload
from ppfs_gateway.uploads import ID_PATTERN


def _utf8(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid UTF-8") from None
    # control, format (bidi overrides, zero-width), private-use, unassigned, line and
    # paragraph separators: a name shows what it says
    if any(unicodedata.category(ch) in _HIDDEN for ch in v):
        raise ValueError("control or bidirectional formatting characters are not allowed")
    return v


_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


Text = Annotated[str, AfterValidator(_utf8)]
Identifier = Annotated[str, Field(pattern=ID_PATTERN, min_length=1, max_length=64)]
Base64 = Annotated[str, Field(pattern=r"^[A-Za-z0-9+/=]*$", description="standard base64")]


def b64decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedUpload(f"{what} is not valid base64") from None


def b64encode(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


class Strict(BaseModel):
    # strict: "k": "3" is not a number, and nothing unknown is ignored
    model_config = ConfigDict(extra="forbid", strict=True)


class PartyOut(BaseModel):
    index: int
    name: str
    box_public_key: str = Field(description="X25519, base64: seal share bundles to it")
    signing_public_key: str = Field(description="Ed25519, base64: signs result parts")
    mpc_address: str
    engines: list[str]
    key_statement: str = Field(
        description="the deployment CA's statement of this party's keys (ppfs.keycert), base64"
    )
    key_statement_signature: str = Field(
        description="ECDSA P-256 / SHA-256 by the deployment CA over key_statement, base64"
    )


class FixedPointOut(BaseModel):
    frac_bits: int
    value_bits: int
    target_bits: int


class DeploymentOut(BaseModel):
    parties: list[PartyOut]
    scheme: str
    securities: list[str]
    fixed_point: FixedPointOut
    deployment_ca_pem: str = Field(
        description="the deployment CA certificate as the parties hold it; clients trust it "
        "only when its SHA-256 is the fingerprint they were given out of band"
    )
    revocation_list: str = Field(
        default="", description="the deployment CA's revocation list (ppfs.keycert), base64; "
        "clients require a fresh one that does not name a key statement that asks for it"
    )
    revocation_list_signature: str = Field(
        default="", description="ECDSA P-256 / SHA-256 by the deployment CA over "
        "revocation_list, base64"
    )


class DatasetCreate(Strict):
    name: Annotated[Text, Field(min_length=1, max_length=128)]
    kind: Literal["data", "mask"] = "data"
    owner_id: Identifier | None = Field(default=None, description="admins only: the owner")


class DatasetOut(BaseModel):
    id: str
    name: str
    owner_id: str
    kind: str
    rows: int = Field(description="m: rows over every upload")
    p: int = Field(description="number of feature columns")
    columns: list[str]
    column_exponents: list[int]
    label_column: str
    classes: list[str]
    frac_bits: int | None
    upload_ids: list[str]
    created_at: str


class UploadCreate(Strict):
    upload_id: Identifier
    manifest: Base64 = Field(description="canonical JSON manifest (ppfs.upload.Manifest)")
    manifest_signature: Base64 = Field(description="Ed25519 by the owner over the manifest")
    parts: list[Base64] = Field(
        min_length=1, max_length=4, description="sealed part per party, in party order"
    )


class HeldUploadOut(BaseModel):
    upload_id: str
    status: str = Field(description="committed | staged (waiting for the gateway's decision)"
                        " | damaged (a share file damaged there: set aside)")
    manifest_sha256: str
    rows: int


class PartyHoldingOut(BaseModel):
    index: int
    name: str
    reachable: bool
    error: str
    consistent: bool
    held: list[HeldUploadOut]
    missing: list[str] = Field(description="recorded uploads this party does not hold")
    damaged: list[str] = Field(
        default_factory=list,
        description="recorded uploads whose share file this party found damaged (set "
        "aside, used by no job; also in missing, for the owner's repair)")
    pending: list[str] = Field(description="recorded uploads whose commit has not reached it")
    mismatched: list[str] = Field(description="uploads it holds under another manifest")
    unexpected: list[str] = Field(description="committed uploads the gateway never recorded")
    problems: list[str]


class RecordedUploadOut(BaseModel):
    upload_id: str
    owner_id: str
    manifest_sha256: str
    rows: int


class DatasetCheckOut(BaseModel):
    dataset_id: str
    consistent: bool
    recorded: list[RecordedUploadOut]
    parties: list[PartyHoldingOut]


class UploadRepair(Strict):
    party: int = Field(ge=0, le=3, description="index of the party that lost its part")
    manifest: Base64 = Field(description="the upload's original signed manifest")
    manifest_signature: Base64
    part: Base64 = Field(description="that party's original sealed part")
    # a party that expired the part undecided stores it again only with these
    repair: Base64 = Field(default="", max_length=2048,
                           description="the owner's signed repair (ppfs.upload.Repair) of "
                                       "this upload for that party")
    repair_signature: Base64 = Field(default="", max_length=128,
                                     description="its Ed25519 signature by the owner")


class WithdrawalCreate(Strict):
    # a statement is a few hundred bytes (ppfs.withdrawal.MAX_STATEMENT_BYTES at most)
    statement: Base64 = Field(max_length=8192, description="the owner's withdrawal or "
                              "revocation (ppfs.withdrawal.Withdrawal, .Revocation)")
    signature: Base64 = Field(max_length=128, description="its Ed25519 signature by the owner")


class PartyReceiptOut(BaseModel):
    index: int
    name: str
    receipt: str = Field(description="the party's receipt, base64 (empty if none came)")
    receipt_signature: str = Field(description="its signature by the party's key, base64")
    error: str = Field(description="why the party gave no receipt, if it gave none")


class WithdrawalOut(BaseModel):
    dataset_id: str
    withdrawal_sha256: str = Field(description="SHA-256 of the statement relayed")
    removed: list[str] = Field(description="taken out of the gateway's record now: upload "
                               "ids (a withdrawal), consent SHA-256s (a revocation)")
    parties: list[PartyReceiptOut]


class HoldingsAsk(Strict):
    challenge: Base64 = Field(max_length=64, description="32 random bytes the owner's "
                              "client chose, which every party's statement must answer")


class HoldingsOut(BaseModel):
    dataset_id: str
    parties: list[PartyReceiptOut] = Field(
        description="each party's signed statement of what it holds of the caller's "
        "uploads (ppfs.holdings.HoldingsStatement) in `receipt`, or why it gave none")


class GrantCreate(Strict):
    subject: Identifier


class GrantOut(BaseModel):
    dataset_id: str
    subject: str


class ConsentCreate(Strict):
    statement: Base64 = Field(max_length=8192,
                              description="canonical JSON consent (ppfs.contract.Consent)")
    signature: Base64 = Field(max_length=128,
                              description="Ed25519 by the owner over the statement")


class ConsentOut(BaseModel):
    dataset_id: str
    owner_id: str
    recipient: str
    recipient_public_key: str = Field(description="X25519, base64")
    reveal: Literal["selection", "selection+model"]
    expires_at: str = Field(default="", description="UTC; empty: the consent does not expire")
    max_jobs: int = Field(default=0, description="jobs it allows at each party; 0: any number")
    min_rows: int = Field(default=0, description="rows of the data set a job must pin, as "
                          "each party counts them; 0: no minimum")
    min_own_rows: int = Field(default=0, description="rows of the data set from the owner's "
                              "own uploads a job must pin, as each party counts them from "
                              "the manifests the owner signed; 0: no minimum")
    securities: list[str] = Field(default_factory=list, description="the security settings "
                                  "a job may run in, as each party checks them; empty: any")


class TrainingIn(Strict):
    epochs: int = Field(ge=1, le=10_000)
    batch_size: int = Field(ge=1, le=1 << 20)
    learning_rate: float = Field(gt=0, le=4)
    seed: int = Field(default=0, ge=0, lt=1 << 63, description="public batch-order seed")
    weight_bits: int = Field(
        default=10, ge=1, le=10,
        description="the run stops with an error if a standardised weight reaches 2^weight_bits",
    )


class RequestIn(Strict):
    statement: Base64 = Field(description="canonical JSON job request (ppfs.contract.JobRequest)")
    signature: Base64 = Field(description="Ed25519 by the recipient over the statement")


class JobCreate(Strict):
    dataset_ids: list[Identifier] = Field(min_length=1, max_length=16)
    combination: Literal["horizontal", "vertical"] = "horizontal"
    label_column: Annotated[Text, Field(min_length=1, max_length=256)]
    k: int = Field(ge=1, le=1 << 20)
    security: Literal["passive-3pc", "active-3pc", "active-4pc", "passive-4pc"] = "passive-3pc"
    engine: Literal["mp-spdz", "mpyc"] = "mp-spdz"
    scorer: Literal["ms-gini", "pearson", "chi2"] = Field(
        default="ms-gini",
        description="feature score computed inside MPC: ms-gini (mean-split Gini), pearson "
        "(squared Pearson correlation with the label, one-vs-rest summed beyond two classes), "
        "chi2 (Pearson's chi-squared of the mean split against the label)",
    )
    training: TrainingIn | None = None
    recipient_public_key: Base64 = Field(description="X25519 public key, base64 (32 bytes)")
    mask_upload_id: Identifier
    request: RequestIn | None = Field(
        default=None,
        description="the recipient's signed request: every party runs the job only if it "
        "states exactly these parameters (the client signs it)",
    )


class JobValidate(JobCreate):
    """A job to check before anything is uploaded for it (its masks): the same fields,
    the recipient's key and mask upload optional."""

    recipient_public_key: Base64 | None = None  # type: ignore[assignment]
    mask_upload_id: Identifier | None = None  # type: ignore[assignment]


class JobValidOut(BaseModel):
    m: int
    p: int
    classes: list[str]
    columns: list[str]
    outputs: int = Field(description="mask words the job opens: upload this many")


class PartyStateOut(BaseModel):
    index: int
    name: str
    state: str
    phase: str
    progress: float
    error: str
    program_sha256: str
    seconds: float
    bytes_sent: int
    failure_kind: str = Field(default="", description="why this party failed, if it did")


class JobOut(BaseModel):
    id: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    error: str
    failure_kind: str = Field(
        default="", description="why a failed or cancelled job did not succeed: own, "
        "peer_lost, timeout, stalled (no progress: a peer stopped answering), integrity, "
        "out_of_range, refused, session, restarted, party_lost, cancelled, other"
    )
    submitter: str
    dataset_ids: list[str]
    combination: str
    label_column: str
    k: int
    security: str
    engine: str
    scorer: str
    mask_upload_id: str
    training: TrainingIn | None
    m: int
    p: int
    outputs: int
    columns: list[str]
    column_exponents: list[int]
    classes: list[str]
    frac_bits: int
    description_sha256: str
    created_at: str
    updated_at: str
    parties: list[PartyStateOut]


class ResultPartOut(BaseModel):
    party_index: int
    sealed: str = Field(description="sealed box to the recipient, base64")
    signature: str = Field(description="Ed25519 by the party over job_id || sealed, base64")
    statement: str = Field(
        description="the party's result statement (ppfs.contract.ResultStatement), base64"
    )
    statement_signature: str = Field(description="Ed25519 by the party over statement")


class ResultOut(BaseModel):
    job_id: str
    parts: list[ResultPartOut]


class ProblemOut(BaseModel):
    """RFC 9457 problem details (media type application/problem+json)."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[dict[str, Any]] | None = None
    # a job submission refused before its job was recorded (any status, 5xx too): false,
    # and the reason (the problem type's slug); absent where the gateway does not know
    job_created: bool | None = None
    no_job_reason: str | None = None


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        401: "no or unknown bearer token",
        403: "the token's role may not do this",
        404: "no such resource visible to this principal",
        409: "conflicts with the current state",
        413: "request body too large",
        422: "invalid request, malformed upload or incompatible schemas",
        502: "a party did not answer",
        503: "a party is stopping and takes no new job (Retry-After: seconds until it has "
             "stopped at the latest)",
        507: "the gateway's disk is full or a write of its state failed (nothing kept)",
    }
    schema = ProblemOut.model_json_schema()
    return {
        c: {"description": what[c], "content": {"application/problem+json": {"schema": schema}}}
        for c in codes
    }
