"""Append-only audit log of one party: JSON lines, one per accepted or refused
upload, job start and end, and every opening of (masked) values.

Entries carry public facts only: ids, shapes, parameters, program hashes, key
fingerprints, word counts. Never a share, a key or an opened word.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, event: str, **fields: Any) -> None:
        entry = {"ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                 "event": event, **fields}
        line = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str) + "\n"
        data = line.encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                end = os.fstat(fd).st_size
                try:
                    written = os.write(fd, data)
                    if written != len(data):  # a full disk takes part of the line
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    os.fsync(fd)
                except OSError:
                    # no torn line is left to spoil the log (and the next entry with it)
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, end)
                    raise
            finally:
                os.close(fd)

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
