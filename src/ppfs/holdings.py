"""What a party holds of an owner's uploads, in its own signed words.

The gateway records an upload as added once every party stored and committed its part,
and tells the owner so. A turned gateway could say so of an upload it aborted at the
parties, or never committed, and the owner would believe its rows are in the data set
(and in the jobs it consents to) when they are not. So the owner does not take the
gateway's word: its client picks a fresh random challenge and every party answers with a
:class:`HoldingsStatement` signed by its own key (the one its certified key statement
names) listing what it holds of that owner's uploads of the data set, with each upload's
manifest digest, rows and status. The challenge makes the statement fresh: the gateway
cannot answer with one a party signed before it lost or dropped an upload.

A party answers this for any owner id it is asked about: what it lists (upload ids, row
counts, manifest digests) is what the gateway records anyway.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from nacl.signing import SigningKey

from ppfs.errors import ParameterError
from ppfs.withdrawal import MAX_RECEIPT_IDS, ReceiptRejected, _signed_by

HOLDINGS_PURPOSE = "ppfs holdings v1"
CHALLENGE_BYTES = 32
STATUSES = ("committed", "staged", "damaged")
_SUBJECT = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class HoldingsRequestError(ParameterError):
    """A request for a party's holdings it does not answer (malformed)."""


def new_challenge() -> bytes:
    """A fresh challenge, from the OS's CSPRNG."""
    return secrets.token_bytes(CHALLENGE_BYTES)


def check_request(owner_id: str, dataset_id: str, challenge: bytes) -> None:
    """HoldingsRequestError unless the request names an owner and a data set by id and
    carries a challenge of :data:`CHALLENGE_BYTES` bytes."""
    if not _SUBJECT.match(owner_id):
        raise HoldingsRequestError("a request for holdings names its owner by subject id")
    if not _ID.match(dataset_id):
        raise HoldingsRequestError("a request for holdings names its data set by id")
    if len(challenge) != CHALLENGE_BYTES:
        raise HoldingsRequestError(
            f"a request for holdings carries a {CHALLENGE_BYTES}-byte challenge")


@dataclass(frozen=True)
class Held:
    """One upload as a party holds it."""

    upload_id: str
    manifest_sha256: str
    rows: int
    status: str  # one of STATUSES


@dataclass(frozen=True)
class HoldingsStatement:
    """Party ``party_index`` holds ``uploads`` of ``owner_id``'s uploads of
    ``dataset_id``, and nothing else of them, as it answered ``challenge`` (hex)."""

    party_index: int
    owner_id: str
    dataset_id: str
    challenge: str
    uploads: tuple[Held, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({
            "purpose": HOLDINGS_PURPOSE, "party_index": self.party_index,
            "owner_id": self.owner_id, "dataset_id": self.dataset_id,
            "challenge": self.challenge,
            "uploads": [{"upload_id": u.upload_id, "manifest_sha256": u.manifest_sha256,
                         "rows": u.rows, "status": u.status} for u in self.uploads],
        }, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> HoldingsStatement:
        try:
            d = json.loads(blob)
            if not isinstance(d, dict) or d.pop("purpose") != HOLDINGS_PURPOSE:
                raise ValueError
            raw = d.pop("uploads")
            if not isinstance(raw, list) or len(raw) > MAX_RECEIPT_IDS:
                raise ValueError
            uploads = []
            for u in raw:
                if not isinstance(u, dict) or set(u) != {"upload_id", "manifest_sha256",
                                                         "rows", "status"}:
                    raise ValueError
                h = Held(**u)
                if not (isinstance(h.upload_id, str) and _ID.match(h.upload_id)
                        and isinstance(h.manifest_sha256, str)
                        and _HEX64.match(h.manifest_sha256)
                        and type(h.rows) is int and h.rows >= 0 and h.status in STATUSES):
                    raise ValueError
                uploads.append(h)
            s = cls(uploads=tuple(uploads), **d)
            if not (type(s.party_index) is int and isinstance(s.owner_id, str)
                    and isinstance(s.dataset_id, str) and isinstance(s.challenge, str)):
                raise ValueError
            return s
        except (ValueError, KeyError, TypeError):
            raise ReceiptRejected("a statement of holdings is malformed") from None

    def sign(self, key: SigningKey) -> tuple[bytes, bytes]:
        blob = self.to_bytes()
        return blob, key.sign(blob).signature

    def find(self, upload_id: str) -> Held | None:
        return next((u for u in self.uploads if u.upload_id == upload_id), None)


def open_holdings(owner_id: str, dataset_id: str, challenge: bytes, party_index: int,
                  party_name: str, party_key: bytes, statement: bytes, signature: bytes
                  ) -> HoldingsStatement:
    """A party's statement of holdings, checked: signed by ``party_key`` (the party's
    certified key), by this party, of this owner and data set, and answering this very
    challenge; ReceiptRejected, naming the party, otherwise."""
    _signed_by(party_key, party_name, statement, signature)
    s = HoldingsStatement.from_bytes(statement)
    if (s.party_index, s.owner_id, s.dataset_id) != (party_index, owner_id, dataset_id):
        raise ReceiptRejected(
            f"{party_name}'s statement of holdings is for another party, owner or data set")
    if not secrets.compare_digest(s.challenge, challenge.hex()):
        raise ReceiptRejected(
            f"{party_name}'s statement of holdings answers another request (an old one "
            "replayed?)")
    return s
