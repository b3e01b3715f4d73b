"""Bearer tokens per role, configured at start. Tokens are compared by SHA-256 and
never logged; a principal is known by its role and subject id only."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from ppfs_gateway.core.config import Role, TokenEntry
from ppfs_gateway.errors import Forbidden, Unauthenticated


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


class TokenTable:
    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self._by_hash = {
            hashlib.sha256(e.token.get_secret_value().encode()).digest(): Principal(
                e.role, e.subject
            )
            for e in entries
        }

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("send 'Authorization: Bearer <token>'")
        digest = hashlib.sha256(token.encode()).digest()
        for known, principal in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return principal
        raise Unauthenticated("the bearer token is not valid here")
