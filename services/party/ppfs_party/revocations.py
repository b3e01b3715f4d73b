"""Consent revocations this party keeps (ppfs.withdrawal.Revocation).

Each one is kept as its owner-signed statement in ``<state>/revoked/<sha256>.json``,
written durably before the party answers, and read at every start: a revocation that
cannot be read stops the start (ignoring it would let a revoked consent count again).
A job relying on a consent that a kept revocation covers is refused
(:func:`ppfs.contract.check_consents`).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from ppfs.contract import Consent
from ppfs.durable import write_durable
from ppfs.withdrawal import Revocation, SignedRevocation, WithdrawalError
from ppfs_party.errors import CorruptStateError


class RevocationBook:
    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "revoked"
        self._kept: dict[str, Revocation] = {}

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._kept = {}
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):  # a write cut short: never answered
                path.unlink(missing_ok=True)
                continue
            try:
                d = json.loads(path.read_bytes())
                statement = base64.b64decode(d["statement"], validate=True)
                self._kept[path.stem] = Revocation.from_bytes(statement)
            except (OSError, ValueError, KeyError, TypeError, WithdrawalError):
                raise CorruptStateError(
                    f"consent revocation {path} cannot be read; the party does not start "
                    "without it (a consent its owner revoked would count again): restore it "
                    "from a backup, or have the owner revoke again") from None

    def covers(self, consent: Consent) -> bool:
        """Whether a kept revocation revokes ``consent``."""
        return any(r.covers(consent) for r in self._kept.values())

    def keep(self, signed: SignedRevocation, revocation: Revocation) -> None:
        """Keep a verified revocation, durably (idempotent)."""
        if signed.digest in self._kept:
            return
        write_durable(self.directory / f"{signed.digest}.json", json.dumps({
            "statement": base64.b64encode(signed.statement).decode(),
            "signature": base64.b64encode(signed.signature).decode()}).encode())
        self._kept[signed.digest] = revocation
