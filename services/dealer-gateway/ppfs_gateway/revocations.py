"""The deployment CA's revocation list, as the gateway serves it to clients.

The operator installs the list ``ppfs pki revocations`` writes as the file named by
``revocation_list`` in the gateway config (copied there from cron). The gateway serves
it with the parties' identities (``GET /v1/deployment``); clients check it themselves
against their trust anchor (ppfs.keycert), so the gateway only relays it. The file is
read again when it changes (its size, modification time or inode) and on SIGHUP; a file
that cannot be read or is not a revocation list is logged and the list in force stays.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ppfs.keycert import RevocationList, SignedRevocations, parse_revocations_file
from ppfs.pki import read_regular_file

log = logging.getLogger("ppfs.gateway")


class RevocationFile:
    """The list in force from ``path`` (None: the gateway serves none)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._signed: SignedRevocations = (b"", b"")
        if path is not None:
            self.reload()

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def reload(self) -> bool:
        """Read the file again; on any problem keep the list in force and log why."""
        if self.path is None:
            return False
        seen = self._stat()
        try:
            signed = parse_revocations_file(read_regular_file(self.path))
        except (OSError, ValueError) as exc:
            self._seen = seen  # not re-read for every request until it changes again
            log.error("[Gateway] revocation list not (re)loaded from %s, the one in force "
                      "stays: %s", self.path, exc)
            return False
        self._seen, self._signed = seen, signed
        rl = RevocationList.from_bytes(signed[0])
        log.info("[Gateway] revocation list loaded from %s: %d revoked, issued %s, stale "
                 "after %s", self.path, len(rl.revoked), rl.issued_at, rl.next_update)
        return True

    def current(self) -> SignedRevocations:
        """(list, signature) to serve, re-read first if the file changed."""
        if self.path is not None and self._stat() != self._seen:
            self.reload()
        return self._signed

    def served(self) -> RevocationList | None:
        """The list served, for showing only (its signature is the clients' to check)."""
        blob = self.current()[0]
        return RevocationList.from_bytes(blob) if blob else None
