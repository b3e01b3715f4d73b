"""Bearer tokens per role, from the tokens file: read at start and again on SIGHUP.
Tokens are compared by SHA-256 and never logged; a principal is known by its role and
subject id only.

A token may carry an end (``expires_at``): after it, the token is refused with 401
saying it expired and when, never whose it was. Tokens that end within
:data:`ppfs.pki.RENEW_WITHIN` (30 days) are logged at start and on every reload, and
shown to admins in ``GET /v1/deployment/status``.

A reload replaces the table as a whole or not at all: a tokens file that does not parse
(or where two principals share a token) leaves the tokens in force as they were. A
request is authenticated once, when it arrives: a reload while it runs does not touch it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ppfs.errors import ParameterError
from ppfs.pki import RENEW_WITHIN
from ppfs_gateway.core.config import Role, TokenEntry, read_tokens_file
from ppfs_gateway.errors import Forbidden, TokenExpired, Unauthenticated

log = logging.getLogger("ppfs.gateway")

_REPLACE = "put a new token for it in the tokens file and send the gateway SIGHUP"


@dataclass(frozen=True)
class Principal:
    role: Role
    subject: str

    def require(self, *roles: Role) -> None:
        if self.role not in roles:
            allowed = ", ".join(r.value for r in roles)
            raise Forbidden(
                f"this needs one of the roles {allowed}; the token is {self.role.value}"
            )


@dataclass(frozen=True)
class _Known:
    principal: Principal
    expires_at: dt.datetime | None


def _day(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _table(entries: Iterable[TokenEntry]) -> dict[bytes, _Known]:
    return {
        hashlib.sha256(e.token.get_secret_value().encode()).digest(): _Known(
            Principal(e.role, e.subject), e.expires_at
        )
        for e in entries
    }


def ending_lines(entries: Iterable[_Known], now: dt.datetime,
                 within: dt.timedelta = RENEW_WITHIN) -> list[str]:
    """One line per token that has ended or ends within ``within``, soonest first, by
    role and subject (never the token)."""
    ending = sorted(((k.expires_at, k.principal) for k in entries
                     if k.expires_at is not None and k.expires_at - now <= within),
                    key=lambda e: (e[0], e[1].role.value, e[1].subject))
    out = []
    for end, who in ending:
        whose = f"the {who.role.value} token of {who.subject}"
        if end <= now:
            out.append(f"{whose} expired on {_day(end)}: it is refused; {_REPLACE}")
            continue
        days = (end - now).days
        left = "in less than a day" if days == 0 else f"in {days} day{'s' * (days > 1)}"
        out.append(f"{whose} expires on {_day(end)} ({left}): {_REPLACE}")
    return out


class TokenTable:
    """The tokens in force. One per app, shared by the request guard and the routes;
    ``tokens_file`` is where :meth:`reload` reads them again (None: from the config
    itself, which a restart reads)."""

    def __init__(self, entries: Iterable[TokenEntry], tokens_file: Path | None = None) -> None:
        self.tokens_file = tokens_file
        self._by_hash = _table(entries)

    def authenticate(self, token: str | None, now: dt.datetime | None = None) -> Principal:
        if not token:
            raise Unauthenticated("send 'Authorization: Bearer <token>'")
        digest = hashlib.sha256(token.encode()).digest()
        table = self._by_hash  # one table for the whole lookup, whatever a reload does
        for known, entry in table.items():
            if hmac.compare_digest(known, digest):
                end = entry.expires_at
                if end is not None and end <= (now or dt.datetime.now(dt.UTC)):
                    raise TokenExpired(f"the bearer token expired on {_day(end)}: ask the "
                                       "deployment's operator for a new one")
                return entry.principal
        raise Unauthenticated("the bearer token is not valid here")

    def seconds_left(self, token: str | None, principal: Principal,
                     now: dt.datetime | None = None) -> float | None:
        """How long ``token`` stays in force for ``principal`` (math.inf without an end);
        None once it is not (removed by a reload, given to another, or ended): for a
        connection that outlives the request that opened it."""
        now = now or dt.datetime.now(dt.UTC)
        try:
            if self.authenticate(token, now) != principal:
                return None
        except (Unauthenticated, TokenExpired):
            return None
        digest = hashlib.sha256((token or "").encode()).digest()
        entry = self._by_hash.get(digest)
        if entry is None:  # reloaded between the two looks
            return None
        end = entry.expires_at
        return math.inf if end is None else (end - now).total_seconds()

    def ending(self, now: dt.datetime | None = None) -> list[str]:
        """Lines for the tokens that have ended or end within 30 days."""
        return ending_lines(self._by_hash.values(), now or dt.datetime.now(dt.UTC))

    def earliest_ends(self) -> dict[Role, dt.datetime]:
        """Per role, the soonest end among its tokens that have one."""
        out: dict[Role, dt.datetime] = {}
        for k in self._by_hash.values():
            end, role = k.expires_at, k.principal.role
            if end is not None and (role not in out or end < out[role]):
                out[role] = end
        return out

    def log_ending(self) -> None:
        for line in self.ending():
            log.warning("[Gateway] %s", line)

    def reload(self) -> bool:
        """Read the tokens file again and put it in force as a whole; on any problem
        keep the tokens in force and log the problem (never a value)."""
        if self.tokens_file is None:
            log.warning("[Gateway] tokens not reloaded: they are in the gateway config, not "
                        "in a tokens_file (a restart reads them)")
            return False
        try:
            entries = read_tokens_file(self.tokens_file)
        except ParameterError as exc:
            log.error("[Gateway] tokens not reloaded, the tokens in force stay: %s", exc)
            return False
        new = _table(entries)
        old = self._by_hash
        added = sum(1 for h in new if h not in old)
        removed = sum(1 for h in old if h not in new)
        self._by_hash = new  # one assignment: a lookup sees the old table or the new one
        log.info("[Gateway] tokens reloaded from %s: %d in force (%d added, %d removed)",
                 self.tokens_file, len(new), added, removed)
        self.log_ending()
        return True
