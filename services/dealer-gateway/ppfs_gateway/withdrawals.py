"""Relaying a data owner's withdrawal (ppfs.withdrawal) to every party.

The gateway cannot withdraw anything itself: each party deletes only what the owner's
signature covers, checked against its own registry of owners, and answers with a
receipt signed by its own key, which the owner's client checks. The gateway's part is
to relay the statement to every party at once, to hand back each party's receipt or
why there is none, and, once a party has carried it out (it checked the owner's
signature), to take the covered uploads out of its own record, so that no job it
schedules pins them any more. A party that was not reached keeps its copy until
the owner asks again (a withdrawal is idempotent): the owner's client names it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass

from ppfs.errors import PpfsError
from ppfs.withdrawal import Withdrawal, WithdrawalError
from ppfs_gateway.auth import Principal
from ppfs_gateway.errors import Forbidden, InvalidRequest
from ppfs_gateway.parties import Parties
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
    removed: tuple[str, ...]  # upload ids taken out of the gateway's record now
    parties: tuple[PartyAnswer, ...]


async def relay_withdrawal(registry: Registry, parties: Parties, ds: DatasetRecord,
                           who: Principal, statement: bytes, signature: bytes) -> Relayed:
    """Relay the owner's signed withdrawal of its uploads of ``ds`` to every party."""
    try:
        w = Withdrawal.from_bytes(statement)
    except WithdrawalError as exc:
        raise InvalidRequest(str(exc)) from None
    if w.owner_id != who.subject:
        raise Forbidden("a withdrawal is made by the owner it names")
    if w.dataset_id != ds.id:
        raise InvalidRequest(f"the withdrawal names data set {w.dataset_id!r}, not {ds.id!r}")

    async def one(i: int) -> PartyAnswer:
        c = parties.clients[i]
        try:
            got = await c.withdraw(statement, signature)
        except PpfsError as exc:
            return PartyAnswer(i, c.name, error=str(exc)[:300])
        return PartyAnswer(i, c.name, got.receipt, got.receipt_signature)

    answers = await asyncio.gather(*(one(i) for i in range(len(parties))))
    # out of the gateway's record once a party carried it out, which it does only on the
    # owner's signature (a stolen token alone withdraws nothing), whatever the others
    # answered: a job pinning an upload some party has deleted could not run anyway
    removed = (registry.withdraw_uploads(ds.id, w.owner_id, w.signed_at)
               if any(a.receipt for a in answers) else [])
    log.info("[Gateway.Withdraw] dataset=%s owner=%s uploads removed=%d parties "
             "answered=%d/%d", ds.id, w.owner_id, len(removed),
             sum(not a.error for a in answers), len(answers))
    return Relayed(hashlib.sha256(statement).hexdigest(), tuple(removed), tuple(answers))
