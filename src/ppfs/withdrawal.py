"""A data owner takes back its data (a withdrawal) or its consent (a revocation), and each
party's signed receipt.

The owner signs a :class:`Withdrawal`: "delete every upload I made into this data set and
signed at or before this time". The gateway only relays it. Every party checks the
signature against the owner's key in its own ``owners.json`` (never the gateway's word),
deletes those uploads (committed, staged, or set aside as damaged), refuses their ids from
then on (a repair or a copy the gateway kept cannot bring them back), stops its unfinished
jobs that use one, and answers with a :class:`WithdrawalReceipt` signed by its own key,
the one its certified key statement names. The owner's client checks each receipt, so a
gateway that does not relay the withdrawal, or forges an answer, is caught: the party is
named as not confirmed.

A withdrawal covers uploads by their owner-signed time, not by a list of ids the gateway
could shorten: a replayed withdrawal deletes nothing the owner sent after signing it.

A :class:`Revocation` works alike for consents: the owner revokes every consent it gave a
recipient for a data set up to now (by the consents' signed times, so that one the
gateway does not list is revoked too); each party keeps it durably, refuses from then on
a job that relies on such a consent, stops its unfinished jobs that do, and answers with a
signed :class:`RevocationReceipt`. A consent signed later is not covered: the owner can
consent again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from ppfs.contract import Consent, utc_time
from ppfs.errors import ParameterError, ShareFormatError
from ppfs.upload import SIGNED_AT_FORMAT, Manifest, UploadRejected

WITHDRAWAL_PURPOSE = "ppfs withdrawal v1"
RECEIPT_PURPOSE = "ppfs withdrawal receipt v1"
REVOCATION_PURPOSE = "ppfs consent revocation v1"
REVOCATION_RECEIPT_PURPOSE = "ppfs consent revocation receipt v1"
MAX_STATEMENT_BYTES = 4096  # a withdrawal is a few hundred bytes
MAX_RECEIPT_IDS = 100_000  # upload ids a receipt may name
_SUBJECT = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class WithdrawalError(ParameterError):
    """A withdrawal a party does not carry out (malformed, not signed by its owner)."""


class ReceiptRejected(ShareFormatError):
    """A party's receipt the owner's client does not accept (unsigned, forged, for
    another withdrawal or party, or stating that data is still held)."""


def _canonical(d: dict[str, object]) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Withdrawal:
    """``owner_id`` withdraws every upload it made into ``dataset_id`` and signed at or
    before ``signed_at`` (UTC, :data:`ppfs.upload.SIGNED_AT_FORMAT`)."""

    owner_id: str
    dataset_id: str
    signed_at: str

    @classmethod
    def now(cls, owner_id: str, dataset_id: str) -> Withdrawal:
        return cls(owner_id, dataset_id, dt.datetime.now(dt.UTC).strftime(SIGNED_AT_FORMAT))

    def to_bytes(self) -> bytes:
        self._check()
        return _canonical({"purpose": WITHDRAWAL_PURPOSE, "owner_id": self.owner_id,
                           "dataset_id": self.dataset_id, "signed_at": self.signed_at})

    def _check(self) -> None:
        if not _SUBJECT.match(self.owner_id):
            raise WithdrawalError("a withdrawal names its owner by subject id")
        if not _ID.match(self.dataset_id):
            raise WithdrawalError("a withdrawal names its data set by id")
        try:
            dt.datetime.strptime(self.signed_at, SIGNED_AT_FORMAT)
        except ValueError:
            raise WithdrawalError("a withdrawal's time is not a UTC time") from None

    @classmethod
    def from_bytes(cls, blob: bytes) -> Withdrawal:
        try:
            if len(blob) > MAX_STATEMENT_BYTES:
                raise ValueError
            d = json.loads(blob)
            if not isinstance(d, dict) or d.get("purpose") != WITHDRAWAL_PURPOSE:
                raise ValueError
            w = cls(d["owner_id"], d["dataset_id"], d["signed_at"])
            if not all(isinstance(v, str) for v in (w.owner_id, w.dataset_id, w.signed_at)):
                raise ValueError
            w._check()
            return w
        except (ValueError, KeyError, TypeError, WithdrawalError):
            raise WithdrawalError("a withdrawal statement is malformed") from None

    def covers(self, manifest: Manifest) -> bool:
        """Whether the upload of ``manifest`` is one this withdrawal deletes: the owner's,
        of the data set, signed at or before the withdrawal (a manifest whose time does
        not parse is the owner's own older form: covered)."""
        if (manifest.owner_id, manifest.dataset_id) != (self.owner_id, self.dataset_id):
            return False
        try:
            return manifest.signed_at() <= self.signed_at
        except UploadRejected:
            return True

    def sign(self, key: SigningKey) -> SignedWithdrawal:
        blob = self.to_bytes()
        return SignedWithdrawal(blob, key.sign(blob).signature)


@dataclass(frozen=True)
class _Signed:
    """An owner's statement and its Ed25519 signature."""

    statement: bytes
    signature: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.statement).hexdigest()

    def _check(self, owner_key: bytes, owner_id: str, what: str) -> None:
        try:
            VerifyKey(owner_key).verify(self.statement, self.signature)
        except (BadSignatureError, ValueError):
            raise WithdrawalError(
                f"the {what} is not signed by the key registered for {owner_id!r}") from None


@dataclass(frozen=True)
class SignedWithdrawal(_Signed):
    def verify(self, owner_key: bytes) -> Withdrawal:
        """The withdrawal, if ``owner_key`` signed it; WithdrawalError otherwise."""
        w = Withdrawal.from_bytes(self.statement)
        self._check(owner_key, w.owner_id, "withdrawal")
        return w


@dataclass(frozen=True)
class WithdrawalReceipt:
    """What one party states once it carried out a withdrawal: the uploads it deleted
    now, and that it holds none of the uploads the withdrawal covers (``held`` 0)."""

    withdrawal_sha256: str
    party_index: int
    owner_id: str
    dataset_id: str
    deleted: tuple[str, ...]
    held: int

    def to_bytes(self) -> bytes:
        return _canonical({"purpose": RECEIPT_PURPOSE,
                           "withdrawal_sha256": self.withdrawal_sha256,
                           "party_index": self.party_index, "owner_id": self.owner_id,
                           "dataset_id": self.dataset_id, "deleted": list(self.deleted),
                           "held": self.held})

    @classmethod
    def from_bytes(cls, blob: bytes) -> WithdrawalReceipt:
        try:
            d = json.loads(blob)
            if not isinstance(d, dict) or d.pop("purpose") != RECEIPT_PURPOSE:
                raise ValueError
            deleted = d.pop("deleted")
            if not isinstance(deleted, list) or len(deleted) > MAX_RECEIPT_IDS or not all(
                    isinstance(u, str) and _ID.match(u) for u in deleted):
                raise ValueError
            r = cls(deleted=tuple(deleted), **d)
            if not (type(r.party_index) is int and type(r.held) is int
                    and isinstance(r.withdrawal_sha256, str)):
                raise ValueError
            return r
        except (ValueError, KeyError, TypeError):
            raise ReceiptRejected("a withdrawal receipt is malformed") from None

    def sign(self, key: SigningKey) -> tuple[bytes, bytes]:
        blob = self.to_bytes()
        return blob, key.sign(blob).signature


def _signed_by(party_key: bytes, party_name: str, statement: bytes, signature: bytes) -> None:
    if not statement:
        raise ReceiptRejected(f"{party_name} sent no signed receipt")
    try:
        VerifyKey(party_key).verify(statement, signature)
    except (BadSignatureError, ValueError):
        raise ReceiptRejected(
            f"{party_name}'s receipt is not signed by {party_name}'s certified key") from None


def open_receipt(withdrawal: SignedWithdrawal, party_index: int, party_name: str,
                 party_key: bytes, statement: bytes, signature: bytes) -> WithdrawalReceipt:
    """A party's receipt, checked: signed by ``party_key`` (the party's certified key),
    for this very withdrawal and party, and stating that the party holds none of the
    uploads it covers; ReceiptRejected, naming the party, otherwise."""
    _signed_by(party_key, party_name, statement, signature)
    r = WithdrawalReceipt.from_bytes(statement)
    w = Withdrawal.from_bytes(withdrawal.statement)
    if (r.withdrawal_sha256, r.party_index, r.owner_id, r.dataset_id) != (
            withdrawal.digest, party_index, w.owner_id, w.dataset_id):
        raise ReceiptRejected(f"{party_name}'s receipt is for another withdrawal or party")
    if r.held:
        raise ReceiptRejected(f"{party_name} still holds {r.held} of the uploads withdrawn")
    return r


# ---------------------------------------------------------------- consents


@dataclass(frozen=True)
class Revocation:
    """``owner_id`` revokes every consent it gave ``recipient`` for ``dataset_id`` and
    signed at or before ``signed_at`` (UTC, :data:`ppfs.upload.SIGNED_AT_FORMAT`)."""

    owner_id: str
    dataset_id: str
    recipient: str
    signed_at: str

    @classmethod
    def now(cls, owner_id: str, dataset_id: str, recipient: str) -> Revocation:
        return cls(owner_id, dataset_id, recipient,
                   dt.datetime.now(dt.UTC).strftime(SIGNED_AT_FORMAT))

    def _check(self) -> None:
        if not (_SUBJECT.match(self.owner_id) and _SUBJECT.match(self.recipient)):
            raise WithdrawalError("a revocation names its owner and recipient by subject id")
        if not _ID.match(self.dataset_id):
            raise WithdrawalError("a revocation names its data set by id")
        try:
            dt.datetime.strptime(self.signed_at, SIGNED_AT_FORMAT)
        except ValueError:
            raise WithdrawalError("a revocation's time is not a UTC time") from None

    def to_bytes(self) -> bytes:
        self._check()
        return _canonical({"purpose": REVOCATION_PURPOSE, "owner_id": self.owner_id,
                           "dataset_id": self.dataset_id, "recipient": self.recipient,
                           "signed_at": self.signed_at})

    @classmethod
    def from_bytes(cls, blob: bytes) -> Revocation:
        try:
            if len(blob) > MAX_STATEMENT_BYTES:
                raise ValueError
            d = json.loads(blob)
            if not isinstance(d, dict) or d.get("purpose") != REVOCATION_PURPOSE:
                raise ValueError
            r = cls(d["owner_id"], d["dataset_id"], d["recipient"], d["signed_at"])
            if not all(isinstance(v, str) for v in (r.owner_id, r.dataset_id, r.recipient,
                                                     r.signed_at)):
                raise ValueError
            r._check()
            return r
        except (ValueError, KeyError, TypeError, WithdrawalError):
            raise WithdrawalError("a revocation statement is malformed") from None

    def covers(self, consent: Consent) -> bool:
        """Whether ``consent`` is one this revocation revokes: the owner's, for the data
        set and recipient, signed at or before the revocation (a consent states its time
        to the second: one signed in the revocation's second is covered; one whose time
        does not parse is covered too)."""
        if (consent.owner_id, consent.dataset_id, consent.recipient) != (
                self.owner_id, self.dataset_id, self.recipient):
            return False
        try:
            given = utc_time(consent.created_at)
        except ValueError:
            return True
        revoked = dt.datetime.strptime(self.signed_at, SIGNED_AT_FORMAT).replace(tzinfo=dt.UTC)
        return given <= revoked

    def sign(self, key: SigningKey) -> SignedRevocation:
        blob = self.to_bytes()
        return SignedRevocation(blob, key.sign(blob).signature)


@dataclass(frozen=True)
class SignedRevocation(_Signed):
    def verify(self, owner_key: bytes) -> Revocation:
        """The revocation, if ``owner_key`` signed it; WithdrawalError otherwise."""
        r = Revocation.from_bytes(self.statement)
        self._check(owner_key, r.owner_id, "revocation")
        return r


@dataclass(frozen=True)
class RevocationReceipt:
    """What one party states once it keeps a revocation: from now on it runs no job on
    a consent the revocation covers (``jobs_stopped``: its unfinished ones it stopped)."""

    revocation_sha256: str
    party_index: int
    owner_id: str
    dataset_id: str
    recipient: str
    jobs_stopped: int

    def to_bytes(self) -> bytes:
        return _canonical({"purpose": REVOCATION_RECEIPT_PURPOSE,
                           "revocation_sha256": self.revocation_sha256,
                           "party_index": self.party_index, "owner_id": self.owner_id,
                           "dataset_id": self.dataset_id, "recipient": self.recipient,
                           "jobs_stopped": self.jobs_stopped})

    @classmethod
    def from_bytes(cls, blob: bytes) -> RevocationReceipt:
        try:
            d = json.loads(blob)
            if not isinstance(d, dict) or d.pop("purpose") != REVOCATION_RECEIPT_PURPOSE:
                raise ValueError
            r = cls(**d)
            if not (type(r.party_index) is int and type(r.jobs_stopped) is int
                    and isinstance(r.revocation_sha256, str)):
                raise ValueError
            return r
        except (ValueError, KeyError, TypeError):
            raise ReceiptRejected("a revocation receipt is malformed") from None

    def sign(self, key: SigningKey) -> tuple[bytes, bytes]:
        blob = self.to_bytes()
        return blob, key.sign(blob).signature


def open_revocation_receipt(revocation: SignedRevocation, party_index: int, party_name: str,
                            party_key: bytes, statement: bytes, signature: bytes
                            ) -> RevocationReceipt:
    """A party's receipt for a revocation, checked like :func:`open_receipt`."""
    _signed_by(party_key, party_name, statement, signature)
    got = RevocationReceipt.from_bytes(statement)
    r = Revocation.from_bytes(revocation.statement)
    if (got.revocation_sha256, got.party_index, got.owner_id, got.dataset_id,
            got.recipient) != (revocation.digest, party_index, r.owner_id, r.dataset_id,
                               r.recipient):
        raise ReceiptRejected(f"{party_name}'s receipt is for another revocation or party")
    return got
