"""Data sets and their uploads: checks on the public manifest, then a relay of each
sealed part to its party. The gateway cannot open a part; it checks that each part
is the one the owner's manifest names (SHA-256) and that the public schema fits
the data set, and stores nothing until every party has stored its part."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import uuid
from dataclasses import dataclass

from ppfs.upload import Manifest
from ppfs.v1 import party_pb2 as pb
from ppfs_gateway.auth import Principal
from ppfs_gateway.core.config import Role
from ppfs_gateway.errors import (
    Conflict,
    Forbidden,
    IncompatibleSchemas,
    InvalidRequest,
    MalformedUpload,
    NotFound,
    PartyRejected,
)
from ppfs_gateway.parties import Parties
from ppfs_gateway.registry import DatasetRecord, DatasetSchema, Registry

log = logging.getLogger("ppfs.gateway")

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_ID = re.compile(ID_PATTERN)
MASK_COLUMNS = ("mask_w0", "mask_w1")
KINDS = ("data", "mask")


def new_id() -> str:
    return uuid.uuid4().hex


def can_see(dataset: DatasetRecord, who: Principal) -> bool:
    if who.role is Role.ADMIN or dataset.owner_id == who.subject:
        return True
    return dataset.kind == "data" and who.subject in dataset.grants


def visible_dataset(registry: Registry, dataset_id: str, who: Principal) -> DatasetRecord:
    """The data set, or NotFound also when it exists but is not this principal's to see."""
    ds = registry.get_dataset(dataset_id) if _ID.match(dataset_id) else None
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


async def relay_upload(
    registry: Registry, parties: Parties, ds: DatasetRecord, up: UploadPart, who: Principal
) -> DatasetRecord:
    if not _ID.match(up.upload_id):
        raise InvalidRequest("upload_id must be 1-64 letters, digits, '-' or '_'")
    man, schema = check_manifest(ds, up, who, len(parties), registry)
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
                ),
                up.parts[c.index],
            )
            for c in parties.clients
        ),
        return_exceptions=True,
    )
    for r in results:
        if isinstance(r, BaseException):
            raise r
    for c, r in zip(parties.clients, results, strict=True):
        assert isinstance(r, pb.PutUploadPartResponse)
        if r.upload_id != up.upload_id or r.rows != man.rows:
            raise PartyRejected(f"{c.name} acknowledged another upload or shape")
    registry.add_upload(ds.id, up.upload_id, who.subject, schema, man.rows, man.digest())
    log.info(
        "[Gateway.Upload] dataset=%s upload=%s rows=%d columns=%d",
        ds.id,
        up.upload_id,
        man.rows,
        len(man.columns),
    )
    got = registry.get_dataset(ds.id)
    assert got is not None
    return got
