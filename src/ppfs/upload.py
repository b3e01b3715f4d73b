"""Sealed, signed uploads: how a data owner's shares reach a party through the gateway.

The client seals each party's share bundles to that party's X25519 box key
(libsodium sealed box: only that party can open it) and signs a manifest with the
owner's Ed25519 key. The manifest binds the dataset, the upload, the public
schema and the SHA-256 of every party's sealed part, so a party can check that
its part comes from a registered owner, belongs to this upload and was not
swapped, re-sealed or mixed with another upload's part by the gateway.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from nacl.bindings import crypto_box_SEALBYTES
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey, VerifyKey

from ppfs.errors import ShareFormatError
from ppfs.sharing import BUNDLE_HEAD_MAX, ShareBundle

_LEN = struct.Struct("<Q")
SIGNED_AT_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class UploadRejected(ShareFormatError):
    """A party refuses an upload part (bad signature, wrong hash, replay, ...)."""


@dataclass(frozen=True)
class Manifest:
    dataset_id: str
    upload_id: str
    owner_id: str
    scheme: str
    rows: int
    columns: tuple[str, ...]
    column_exponents: tuple[int, ...]
    label_column: str  # "" when this owner holds no label
    classes: tuple[str, ...]
    frac_bits: int
    part_sha256: tuple[str, ...]  # sealed part per party, in party order
    created_at: str
    # A mask upload names the X25519 key of the recipient its words serve (base64),
    # signed with the recipient's own key: a party uses the masks only for a job whose
    # result is sealed to that key. Left out of the canonical form when empty.
    recipient_public_key: str = ""
    # Earlier uploads of the same rows into the data set that this one replaces (their
    # ids): the owner sent them, was never told they were added, and sends the rows again.
    # A party that holds one of them refuses this upload; otherwise it refuses them from
    # then on, so that at most one of them is ever used. Left out when empty.
    supersedes: tuple[str, ...] = ()

    def to_bytes(self) -> bytes:
        d = asdict(self)
        if not self.recipient_public_key:
            del d["recipient_public_key"]
        if self.supersedes:
            d["supersedes"] = list(self.supersedes)
        else:
            del d["supersedes"]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Manifest:
        try:
            d = json.loads(blob)
            return cls(
                dataset_id=str(d["dataset_id"]),
                upload_id=str(d["upload_id"]),
                owner_id=str(d["owner_id"]),
                scheme=str(d["scheme"]),
                rows=int(d["rows"]),
                columns=tuple(str(c) for c in d["columns"]),
                column_exponents=tuple(int(e) for e in d["column_exponents"]),
                label_column=str(d["label_column"]),
                classes=tuple(str(c) for c in d["classes"]),
                frac_bits=int(d["frac_bits"]),
                part_sha256=tuple(str(h) for h in d["part_sha256"]),
                created_at=str(d["created_at"]),
                recipient_public_key=str(d.get("recipient_public_key", "")),
                supersedes=_superseded(d),
            )
        except (ValueError, KeyError, TypeError):
            raise UploadRejected("upload manifest is malformed") from None

    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def signed_at(self) -> str:
        """The owner-signed creation time as fixed-width UTC text (microseconds), so that
        text order is time order; UploadRejected when it is not an ISO 8601 time."""
        try:
            t = dt.datetime.fromisoformat(self.created_at)
        except ValueError:
            raise UploadRejected("the manifest's creation time is not an ISO 8601 time") from None
        if t.tzinfo is None:
            raise UploadRejected("the manifest's creation time names no time zone")
        return t.astimezone(dt.UTC).strftime(SIGNED_AT_FORMAT)

    def order_key(self) -> tuple[str, str]:
        """Where this upload stands among its data set's uploads: by the time its owner
        signed in the manifest, then by upload id. Every party and the gateway stack a
        data set's rows in this order, fixed by the owners' signatures alone."""
        return self.signed_at(), self.upload_id


MAX_SUPERSEDED = 16  # earlier uploads one upload may replace
_UPLOAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def _superseded(d: dict[str, object]) -> tuple[str, ...]:
    """A manifest's ``supersedes``: distinct upload ids, not its own, at most
    :data:`MAX_SUPERSEDED`; ValueError otherwise."""
    ids = d.get("supersedes", [])
    if not isinstance(ids, list) or (not ids and "supersedes" in d):
        raise ValueError
    if len(ids) > MAX_SUPERSEDED or len(set(ids)) != len(ids) or d["upload_id"] in ids:
        raise ValueError
    if not all(isinstance(u, str) and _UPLOAD_ID.match(u) for u in ids):
        raise ValueError
    return tuple(ids)


def sealed_size_range(manifest: Manifest, components: int) -> tuple[int, int]:
    """The sizes one party's sealed part can have, from the owner-signed manifest alone:
    its words exactly (``components`` share components of the data and, with a label,
    of the one-hot label; or of the two mask words per row), plus the sealed box and, per
    bundle, its length prefix and at most :data:`ppfs.sharing.BUNDLE_HEAD_MAX` bytes."""
    label = max(len(manifest.classes) - 1, 0) if manifest.label_column else 0
    words = sorted({len(manifest.columns) + label, 2})  # a data part, or a mask
    per_column = 8 * max(manifest.rows, 0) * components
    low = crypto_box_SEALBYTES + _LEN.size + words[0] * per_column
    high = crypto_box_SEALBYTES + 2 * (_LEN.size + BUNDLE_HEAD_MAX) + words[-1] * per_column
    return low, high


def pack_bundles(bundles: Sequence[ShareBundle]) -> bytes:
    """Length-prefixed concatenation of one party's bundles (before sealing)."""
    out = bytearray()
    for b in bundles:
        blob = b.to_bytes()
        out += _LEN.pack(len(blob)) + blob
    return bytes(out)


def unpack_bundles(blob: bytes) -> list[ShareBundle]:
    out, pos = [], 0
    while pos < len(blob):
        if pos + _LEN.size > len(blob):
            raise ShareFormatError("sealed part is truncated")
        (n,) = _LEN.unpack_from(blob, pos)
        pos += _LEN.size
        if pos + n > len(blob):
            raise ShareFormatError("sealed part is truncated")
        out.append(ShareBundle.from_bytes(blob[pos : pos + n]))
        pos += n
    return out


def seal(plaintext: bytes, recipient: bytes) -> bytes:
    return SealedBox(PublicKey(recipient)).encrypt(plaintext)


def open_sealed(sealed: bytes, key: PrivateKey) -> bytes:
    try:
        return SealedBox(key).decrypt(sealed)
    except CryptoError:
        raise UploadRejected("the sealed part cannot be opened with this party's key") from None


def sign_manifest(manifest: Manifest, key: SigningKey) -> bytes:
    return key.sign(manifest.to_bytes()).signature


def verify_manifest(blob: bytes, signature: bytes, owner_key: bytes) -> Manifest:
    try:
        VerifyKey(owner_key).verify(blob, signature)
    except (BadSignatureError, ValueError):
        raise UploadRejected("the upload manifest is not signed by its data owner") from None
    return Manifest.from_bytes(blob)


# -- an owner's repair of a part a party expired -------------------------------------

REPAIR_PURPOSE = "ppfs upload repair v1"
# how long a signed repair is taken: an hour, or a party's staged expiry where that is
# shorter, so that a gateway cannot keep one and stage the part again each time it expires
REPAIR_FRESH = dt.timedelta(hours=1)
REPAIR_SKEW = dt.timedelta(minutes=5)  # a signer's clock ahead of the party's
MAX_REPAIR_BYTES = 1024


@dataclass(frozen=True)
class Repair:
    """The owner asks party ``party`` to take its part of ``upload_id`` again, the one
    of the manifest whose SHA-256 it names. A party that expired that part undecided
    (ppfs_party.store) stores it again only with this, signed by the upload's owner
    within :data:`REPAIR_FRESH`: the gateway alone cannot bring an expired part back."""

    owner_id: str
    dataset_id: str
    upload_id: str
    party: int
    manifest_sha256: str
    signed_at: str

    @classmethod
    def now(cls, manifest: bytes, party: int) -> Repair:
        man = Manifest.from_bytes(manifest)
        return cls(man.owner_id, man.dataset_id, man.upload_id, party,
                   hashlib.sha256(manifest).hexdigest(),
                   dt.datetime.now(dt.UTC).strftime(SIGNED_AT_FORMAT))

    def to_bytes(self) -> bytes:
        return json.dumps({"purpose": REPAIR_PURPOSE, **asdict(self)}, sort_keys=True,
                          separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Repair:
        try:
            if len(blob) > MAX_REPAIR_BYTES:
                raise ValueError
            d = json.loads(blob)
            if not isinstance(d, dict) or d.pop("purpose", None) != REPAIR_PURPOSE:
                raise ValueError
            r = cls(**d)
            if not (all(isinstance(v, str) for v in (r.owner_id, r.dataset_id, r.upload_id,
                                                       r.manifest_sha256, r.signed_at))
                    and type(r.party) is int):
                raise ValueError
            dt.datetime.strptime(r.signed_at, SIGNED_AT_FORMAT)
            return r
        except (ValueError, TypeError):
            raise UploadRejected("the owner's repair statement is malformed") from None

    def sign(self, key: SigningKey) -> tuple[bytes, bytes]:
        blob = self.to_bytes()
        return blob, key.sign(blob).signature


def check_repair(statement: bytes, signature: bytes, owner_key: bytes, manifest: bytes,
                 party: int, now: dt.datetime, fresh: dt.timedelta = REPAIR_FRESH) -> Repair:
    """The repair that lets ``party`` store its part of the upload of ``manifest`` again:
    signed by the owner's key, for this very upload, manifest and party, and signed
    within ``fresh`` (a party whose staged parts expire sooner passes its expiry, so a
    repair cannot bring back a part that expired again). UploadRejected naming what is
    wrong otherwise."""
    if not statement:
        raise UploadRejected("no repair signed by its owner came with it")
    try:
        VerifyKey(owner_key).verify(statement, signature)
    except (BadSignatureError, ValueError):
        raise UploadRejected("its repair is not signed by the upload's owner") from None
    r = Repair.from_bytes(statement)
    man = Manifest.from_bytes(manifest)
    if ((r.owner_id, r.dataset_id, r.upload_id, r.party, r.manifest_sha256)
            != (man.owner_id, man.dataset_id, man.upload_id, party,
                hashlib.sha256(manifest).hexdigest())):
        raise UploadRejected("its repair is for another upload, manifest or party")
    at = dt.datetime.strptime(r.signed_at, SIGNED_AT_FORMAT).replace(tzinfo=dt.UTC)
    if not now - fresh <= at <= now + REPAIR_SKEW:
        window = (f"{fresh.total_seconds() / 3600:g} h" if fresh >= dt.timedelta(hours=1)
                  else f"{fresh.total_seconds() / 60:g} min")
        raise UploadRejected(
            f"its repair was signed at {r.signed_at}, not within the last {window}: the "
            "owner signs a new one (`ppfs datasets repair`)")
    return r
