"""Relaying a data owner's withdrawal of its data, or revocation of its consents
(ppfs.withdrawal), to every party.

The gateway cannot withdraw anything itself: each party deletes only what the owner's
signature covers, checked against its own registry of owners, and answers with a
receipt signed by its own key, which the owner's client checks. The gateway's part is
to relay the statement to every party at once, to hand back each party's receipt or
why there is none, and, once a party has carried it out (it checked the owner's
signature), to take the covered uploads out of its own record, so that no job it
schedules pins them any more. A party that was not reached keeps its copy until
the owner asks again (a withdrawal is idempotent): the owner's client names it. A
revocation is relayed alike; the consents it covers leave the gateway's record, so that
no job carries them any more.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ppfs.contract import Consent
from ppfs.errors import PpfsError
from ppfs.holdings import HoldingsRequestError, check_request
from ppfs.v1 import party_pb2 as pb
from ppfs.withdrawal import Revocation, Withdrawal, WithdrawalError
from ppfs_gateway.auth import Principal
from ppfs_gateway.errors import Forbidden, InvalidRequest
from ppfs_gateway.parties import Parties, PartyClient
from ppfs_gateway.registry import DatasetRecord, Registry

log = logging.getLogger("ppfs.gateway")


@dataclass(frozen=True)
class PartyAnswer:
    index: int
    name: str
    receipt: bytes = b""
    receipt_signature: bytes = b""
    error: str = ""


@dataclass(frozen=True)
class Relayed:
    withdrawal_sha256: str
    # taken out of the gateway's record now: upload ids (a withdrawal), or the consents'
    # SHA-256 (a revocation)
    removed: tuple[str, ...]
    parties: tuple[PartyAnswer, ...]


async def relay_withdrawal(registry: Registry, parties: Parties, ds: DatasetRecord,
                           who: Principal, statement: bytes, signature: bytes) -> Relayed:
    """Relay the owner's signed withdrawal of its uploads of ``ds`` to every party."""
    w = _owners_own(Withdrawal.from_bytes, statement, who, ds, "withdrawal")

    answers = await _ask_every_party(
        parties, lambda c: c.withdraw(statement, signature))
    # out of the gateway's record once a party carried it out, which it does only on the
    # owner's signature (a stolen token alone withdraws nothing), whatever the others
    # answered: a job pinning an upload some party has deleted could not run anyway
    removed = (registry.withdraw_uploads(ds.id, w.owner_id, w.signed_at)
               if any(a.receipt for a in answers) else [])
    log.info("[Gateway.Withdraw] dataset=%s owner=%s uploads removed=%d parties "
             "answered=%d/%d", ds.id, w.owner_id, len(removed),
             sum(not a.error for a in answers), len(answers))
    return Relayed(hashlib.sha256(statement).hexdigest(), tuple(removed), tuple(answers))


async def relay_revocation(registry: Registry, parties: Parties, ds: DatasetRecord,
                           who: Principal, statement: bytes, signature: bytes) -> Relayed:
    """Relay the owner's signed revocation of its consents on ``ds`` to every party;
    once a party kept it, the consents it covers leave the gateway's record."""
    r = _owners_own(Revocation.from_bytes, statement, who, ds, "revocation")
    answers = await _ask_every_party(
        parties, lambda c: c.revoke_consents(statement, signature))
    removed = []
    if any(a.receipt for a in answers):
        for c in registry.consents(ds.id):
            if r.covers(Consent.from_bytes(c.statement)):
                registry.remove_consent(c)
                removed.append(hashlib.sha256(c.statement).hexdigest())
    log.info("[Gateway.Revoke] dataset=%s owner=%s recipient=%s consents removed=%d "
             "parties answered=%d/%d", ds.id, r.owner_id, r.recipient, len(removed),
             sum(not a.error for a in answers), len(answers))
    return Relayed(hashlib.sha256(statement).hexdigest(), tuple(removed), tuple(answers))


async def relay_holdings(parties: Parties, ds: DatasetRecord, who: Principal,
                         challenge: bytes) -> tuple[PartyAnswer, ...]:
    """Ask every party what it holds of the caller's own uploads of ``ds``, answering
    the caller's challenge; each party's signed statement, or why it gave none. The
    gateway asks only about the caller's own uploads: its answer could not be trusted
    anyway, the statements are for the owner to check."""
    try:
        check_request(who.subject, ds.id, challenge)
    except HoldingsRequestError as exc:
        raise InvalidRequest(str(exc)) from None
    answers = await _ask_every_party(
        parties, lambda c: c.state_holdings(ds.id, who.subject, challenge))
    log.info("[Gateway.Holdings] dataset=%s owner=%s parties answered=%d/%d", ds.id,
             who.subject, sum(not a.error for a in answers), len(answers))
    return tuple(answers)


S = TypeVar("S", Withdrawal, Revocation)


def _owners_own(parse: Callable[[bytes], S], statement: bytes, who: Principal,
                ds: DatasetRecord, what: str) -> S:
    """The statement, if it is the caller's own about ``ds``; refused otherwise (the
    parties check the owner's signature: the gateway holds no owner keys)."""
    try:
        parsed = parse(statement)
    except WithdrawalError as exc:
        raise InvalidRequest(str(exc)) from None
    if parsed.owner_id != who.subject:
        raise Forbidden(f"a {what} is made by the owner it names")
    if parsed.dataset_id != ds.id:
        raise InvalidRequest(f"the {what} names data set {parsed.dataset_id!r}, not {ds.id!r}")
    return parsed


async def _ask_every_party(
    parties: Parties,
    call: Callable[[PartyClient], Awaitable[pb.WithdrawUploadsResponse
                                            | pb.RevokeConsentsResponse
                                            | pb.StateHoldingsResponse]],
) -> list[PartyAnswer]:
    """Every party's receipt (or signed statement), or why it gave none, asked all at
    once."""

    async def one(i: int) -> PartyAnswer:
        c = parties.clients[i]
        try:
            got = await call(c)
        except PpfsError as exc:
            return PartyAnswer(i, c.name, error=str(exc)[:300])
        if isinstance(got, pb.StateHoldingsResponse):
            return PartyAnswer(i, c.name, got.statement, got.signature)
        return PartyAnswer(i, c.name, got.receipt, got.receipt_signature)

    return list(await asyncio.gather(*(one(i) for i in range(len(parties)))))
