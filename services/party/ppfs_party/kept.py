"""Owner-signed statements this party carried out and keeps: consent revocations and
withdrawals (ppfs.withdrawal).

Each one is kept as its statement and the owner's signature in
``<state>/<folder>/<sha256>.json``, written durably before the party answers, and read at
every start: one that cannot be read stops the start (ignoring it would let a revoked
consent count again, or a withdrawn part be stored again).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from ppfs.contract import Consent
from ppfs.durable import write_durable
from ppfs.withdrawal import Revocation, WithdrawalError
from ppfs_party.errors import CorruptStateError

T = TypeVar("T")


class KeptStatements(Generic[T]):
    """The statements kept in ``directory``, each as ``parse`` reads it."""

    def __init__(self, directory: Path, parse: Callable[[bytes], T], what: str,
                 risk: str) -> None:
        self.directory = directory
        self._parse = parse
        self._what, self._risk = what, risk  # named when one cannot be read
        self._kept: dict[str, T] = {}

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._kept = {}
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):  # a write cut short: never answered
                path.unlink(missing_ok=True)
                continue
            try:
                d = json.loads(path.read_bytes())
                self._kept[path.stem] = self._parse(
                    base64.b64decode(d["statement"], validate=True))
            except (OSError, ValueError, KeyError, TypeError, WithdrawalError):
                raise CorruptStateError(
                    f"{self._what} {path} cannot be read; the party does not start without "
                    f"it ({self._risk}): restore it from a backup, or have the owner make "
                    "it again") from None

    def __iter__(self) -> Iterator[T]:
        return iter(self._kept.values())

    def __contains__(self, digest: str) -> bool:
        return digest in self._kept

    def keep(self, digest: str, statement: bytes, signature: bytes, parsed: T) -> None:
        """Keep a verified statement, durably (idempotent)."""
        if digest in self._kept:
            return
        write_durable(self.directory / f"{digest}.json", json.dumps({
            "statement": base64.b64encode(statement).decode(),
            "signature": base64.b64encode(signature).decode()}).encode())
        self._kept[digest] = parsed


class RevocationBook(KeptStatements[Revocation]):
    """Consent revocations, in ``<state>/revoked/``: a job relying on a consent one of
    them covers is refused (:func:`ppfs.contract.check_consents`)."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir / "revoked", Revocation.from_bytes, "consent revocation",
                         "a consent its owner revoked would count again")

    def covers(self, consent: Consent) -> bool:
        """Whether a kept revocation revokes ``consent``."""
        return any(r.covers(consent) for r in self)
