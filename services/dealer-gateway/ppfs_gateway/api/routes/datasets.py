from __future__ import annotations

import base64
from typing import Literal

from fastapi import APIRouter, status

from ppfs.contract import Consent, ConsentError
from ppfs_gateway.api.deps import (
    JobsDep,
    PartiesDep,
    PrincipalDep,
    RegistryDep,
    ResourcesDep,
)
from ppfs_gateway.api.schemas import (
    ConsentCreate,
    ConsentOut,
    DatasetCheckOut,
    DatasetCreate,
    DatasetOut,
    GrantCreate,
    GrantOut,
    HeldUploadOut,
    HoldingsAsk,
    HoldingsOut,
    PartyHoldingOut,
    PartyReceiptOut,
    RecordedUploadOut,
    UploadCreate,
    UploadRepair,
    WithdrawalCreate,
    WithdrawalOut,
    b64decode,
    b64encode,
)
from ppfs_gateway.core.config import Role
from ppfs_gateway.errors import Conflict, Forbidden, InvalidRequest
from ppfs_gateway.registry import ConsentRecord, DatasetRecord
from ppfs_gateway.uploads import (
    DatasetCheck,
    UploadPart,
    can_see,
    create_dataset,
    relay_upload,
    visible_dataset,
)
from ppfs_gateway.withdrawals import (
    Relayed,
    relay_holdings,
    relay_revocation,
    relay_withdrawal,
)

# consents one owner may keep for one data set (each a few hundred bytes, relayed with
# every job on the data set)
MAX_CONSENTS_PER_OWNER = 1000

router = APIRouter(tags=["datasets"])


def dataset_out(ds: DatasetRecord) -> DatasetOut:
    s = ds.schema
    return DatasetOut(
        id=ds.id,
        name=ds.name,
        owner_id=ds.owner_id,
        kind=ds.kind,
        rows=ds.rows,
        p=len(s.columns) if s else 0,
        columns=list(s.columns) if s else [],
        column_exponents=list(s.column_exponents) if s else [],
        label_column=s.label_column if s else "",
        classes=list(s.classes) if s else [],
        frac_bits=s.frac_bits if s else None,
        upload_ids=list(ds.upload_ids),
        created_at=ds.created_at,
    )


@router.post("/v1/datasets", status_code=status.HTTP_201_CREATED, response_model=DatasetOut)
def post_dataset(body: DatasetCreate, who: PrincipalDep, registry: RegistryDep) -> DatasetOut:
    """Create an empty data set (kind "data") or a mask holder (kind "mask")."""
    return dataset_out(create_dataset(registry, who, body.name, body.kind, body.owner_id))


@router.get("/v1/datasets", response_model=list[DatasetOut])
def list_datasets(
    who: PrincipalDep, registry: RegistryDep, kind: Literal["data", "mask"] = "data"
) -> list[DatasetOut]:
    """The data sets this principal may see: its own and those an admin granted to it."""
    return [dataset_out(d) for d in registry.list_datasets(kind) if can_see(d, who)]


@router.get("/v1/datasets/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: str, who: PrincipalDep, registry: RegistryDep) -> DatasetOut:
    return dataset_out(visible_dataset(registry, dataset_id, who))


@router.post(
    "/v1/datasets/{dataset_id}/uploads",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetOut,
)
async def post_upload(
    dataset_id: str,
    body: UploadCreate,
    who: PrincipalDep,
    registry: RegistryDep,
    parties: PartiesDep,
    jobs: JobsDep,
) -> DatasetOut:
    """Relay the owner's sealed parts, one per party, with the signed manifest. The data set
    (or the new rows) becomes visible once every party stored its part."""
    ds = visible_dataset(registry, dataset_id, who)
    up = UploadPart(
        manifest=b64decode(body.manifest, "manifest"),
        signature=b64decode(body.manifest_signature, "manifest_signature"),
        parts=tuple(b64decode(p, f"part {i}") for i, p in enumerate(body.parts)),
        upload_id=body.upload_id,
    )
    if len(up.signature) != 64:
        raise InvalidRequest("manifest_signature must be a 64-byte Ed25519 signature")
    return dataset_out(await relay_upload(registry, parties, ds, up, who, jobs.uploads))


@router.post(
    "/v1/datasets/{dataset_id}/grants",
    status_code=status.HTTP_201_CREATED,
    response_model=GrantOut,
)
def post_grant(
    dataset_id: str,
    body: GrantCreate,
    who: PrincipalDep,
    registry: RegistryDep,
    res: ResourcesDep,
) -> GrantOut:
    """Admins: let an analyst see a data set's schema and run jobs on it."""
    who.require(Role.ADMIN)
    ds = visible_dataset(registry, dataset_id, who)
    if ds.kind != "data":
        raise InvalidRequest("only data sets are granted")
    if body.subject not in {t.subject for t in res.settings.tokens}:
        raise InvalidRequest("subject: no such principal in this gateway's configuration")
    registry.grant(ds.id, body.subject)
    return GrantOut(dataset_id=ds.id, subject=body.subject)


def check_out(check: DatasetCheck) -> DatasetCheckOut:
    return DatasetCheckOut(
        dataset_id=check.dataset_id,
        consistent=check.consistent,
        recorded=[
            RecordedUploadOut(upload_id=u, owner_id=o, manifest_sha256=sha, rows=rows)
            for u, o, sha, rows in check.recorded
        ],
        parties=[
            PartyHoldingOut(
                index=p.index,
                name=p.name,
                reachable=p.reachable,
                error=p.error,
                consistent=p.consistent,
                held=[
                    HeldUploadOut(upload_id=u, status=st, manifest_sha256=sha, rows=rows)
                    for u, st, sha, rows in p.held
                ],
                missing=p.missing,
                damaged=p.damaged,
                pending=p.pending,
                mismatched=p.mismatched,
                unexpected=p.unexpected,
                problems=p.problems(check.dataset_id),
            )
            for p in check.parties
        ],
    )


@router.get("/v1/datasets/{dataset_id}/check", response_model=DatasetCheckOut)
async def check_dataset(dataset_id: str, who: PrincipalDep, jobs: JobsDep) -> DatasetCheckOut:
    """What every party holds of the data set against what the gateway recorded; each
    party reads every share file of it, and names one it finds damaged."""
    ds = visible_dataset(jobs.registry, dataset_id, who)
    await jobs.uploads.flush(dataset_id=ds.id)
    return check_out(await jobs.uploads.check(ds, verify=True))


@router.post(
    "/v1/datasets/{dataset_id}/uploads/{upload_id}/repair", response_model=DatasetCheckOut
)
async def repair_upload(
    dataset_id: str, upload_id: str, body: UploadRepair, who: PrincipalDep, jobs: JobsDep
) -> DatasetCheckOut:
    """The upload's owner re-sends one party's original sealed part (checked against the
    manifest recorded at upload time) to a party that lost it."""
    ds = visible_dataset(jobs.registry, dataset_id, who)
    check = await jobs.uploads.repair(
        ds,
        who,
        upload_id,
        body.party,
        b64decode(body.manifest, "manifest"),
        b64decode(body.manifest_signature, "manifest_signature"),
        b64decode(body.part, "part"),
        b64decode(body.repair, "repair"),
        b64decode(body.repair_signature, "repair_signature"),
    )
    return check_out(check)


@router.post("/v1/datasets/{dataset_id}/withdraw", response_model=WithdrawalOut)
async def withdraw(
    dataset_id: str, body: WithdrawalCreate, who: PrincipalDep, jobs: JobsDep
) -> WithdrawalOut:
    """Relay an owner's signed withdrawal of its uploads of the data set to every party;
    each party's signed receipt, or why it gave none."""
    ds = visible_dataset(jobs.registry, dataset_id, who)
    async with jobs.uploads.lock(ds.id):  # not while an upload to it is being decided
        out = await relay_withdrawal(
            jobs.registry, jobs.parties, ds, who, b64decode(body.statement, "statement"),
            b64decode(body.signature, "signature"))
    return relayed_out(ds.id, out)


@router.post("/v1/datasets/{dataset_id}/consents/revoke", response_model=WithdrawalOut)
async def revoke_consents(
    dataset_id: str, body: WithdrawalCreate, who: PrincipalDep, jobs: JobsDep
) -> WithdrawalOut:
    """Relay an owner's signed revocation of the consents it gave a recipient for the
    data set to every party; each party's signed receipt, or why it gave none."""
    ds = visible_dataset(jobs.registry, dataset_id, who)
    out = await relay_revocation(
        jobs.registry, jobs.parties, ds, who, b64decode(body.statement, "statement"),
        b64decode(body.signature, "signature"))
    return relayed_out(ds.id, out)


@router.post("/v1/datasets/{dataset_id}/holdings", response_model=HoldingsOut)
async def holdings(
    dataset_id: str, body: HoldingsAsk, who: PrincipalDep, jobs: JobsDep
) -> HoldingsOut:
    """Every party's statement, signed with its own key, of what it holds of the
    caller's uploads of the data set, answering the caller's challenge: an owner checks
    that its uploads are held without taking the gateway's word."""
    ds = visible_dataset(jobs.registry, dataset_id, who)
    answers = await relay_holdings(jobs.parties, ds, who,
                                   b64decode(body.challenge, "challenge"))
    return HoldingsOut(
        dataset_id=ds.id,
        parties=[PartyReceiptOut(index=a.index, name=a.name, receipt=b64encode(a.receipt),
                                 receipt_signature=b64encode(a.receipt_signature),
                                 error=a.error) for a in answers])


def relayed_out(dataset_id: str, out: Relayed) -> WithdrawalOut:
    return WithdrawalOut(
        dataset_id=dataset_id, withdrawal_sha256=out.withdrawal_sha256,
        removed=list(out.removed),
        parties=[PartyReceiptOut(index=a.index, name=a.name, receipt=b64encode(a.receipt),
                                 receipt_signature=b64encode(a.receipt_signature),
                                 error=a.error) for a in out.parties])


def consent_out(c: ConsentRecord) -> ConsentOut:
    signed = Consent.from_bytes(c.statement)
    return ConsentOut(dataset_id=c.dataset_id, owner_id=c.owner_id, recipient=c.recipient,
                      recipient_public_key=c.recipient_key,
                      reveal=c.reveal,  # type: ignore[arg-type]
                      expires_at=signed.expires_at, max_jobs=signed.max_jobs,
                      min_rows=signed.min_rows, min_own_rows=signed.min_own_rows,
                      securities=sorted(s.value for s in signed.securities))


@router.post(
    "/v1/datasets/{dataset_id}/consents",
    status_code=status.HTTP_201_CREATED,
    response_model=ConsentOut,
)
def post_consent(
    dataset_id: str, body: ConsentCreate, who: PrincipalDep, registry: RegistryDep
) -> ConsentOut:
    """Data owners: store a consent signed with your key (``ppfs datasets consent``): jobs
    on this data set may reveal the selection (and the model) to the named recipient and
    key. The gateway only stores and relays it; every party verifies the signature against
    the owner key registered with it before it runs a job on your uploads."""
    ds = visible_dataset(registry, dataset_id, who)
    if ds.kind != "data":
        raise InvalidRequest("consents are given for data sets")
    statement = b64decode(body.statement, "statement")
    signature = b64decode(body.signature, "signature")
    if len(signature) != 64:
        raise InvalidRequest("signature must be a 64-byte Ed25519 signature")
    try:
        c = Consent.from_bytes(statement)
    except ConsentError as exc:
        raise InvalidRequest(str(exc)) from None
    if c.owner_id != who.subject:
        raise Forbidden("a consent is given by its owner only")
    if c.dataset_id != ds.id:
        raise InvalidRequest("the consent names another data set")
    if c.expired():
        raise InvalidRequest(f"the consent expired at {c.expires_at}")
    if who.subject != ds.owner_id and who.subject not in registry.upload_owners(ds.id):
        raise Forbidden("only an owner of the data set's uploads gives consents for it")
    rec = ConsentRecord(ds.id, c.owner_id, c.recipient,
                        base64.b64encode(c.recipient_public_key).decode(), c.reveal.value,
                        statement, signature)
    if registry.count_consents(ds.id, c.owner_id) >= MAX_CONSENTS_PER_OWNER:
        raise Conflict(f"an owner keeps at most {MAX_CONSENTS_PER_OWNER} consents for a data "
                       "set here")
    registry.add_consent(rec)
    return consent_out(rec)


@router.get("/v1/datasets/{dataset_id}/consents", response_model=list[ConsentOut])
def list_consents(dataset_id: str, who: PrincipalDep, registry: RegistryDep) -> list[ConsentOut]:
    """The consents stored for a data set (what the owners agreed to, public)."""
    ds = visible_dataset(registry, dataset_id, who)
    return [consent_out(c) for c in registry.consents(ds.id)]
