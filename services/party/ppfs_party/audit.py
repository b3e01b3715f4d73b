"""Append-only audit log of one party: JSON lines, one per accepted or refused
upload, job start and end, and every opening of (masked) values.

Entries carry public facts only: ids, shapes, parameters, program hashes, key
fingerprints, word counts. Never a share, a key or an opened word.

A refusal costs its caller one call, and the party a synced line: so that a caller
cannot grow the log without bound by being refused, the refusal events
(:data:`RATE_LIMITED`) are written at most :data:`REFUSAL_BURST` at once and one more
per :data:`REFUSAL_REFILL_SECONDS` after that, each event on its own. Those not written
are counted: the next line of that event says how many were left out before it
(``"left_out": n``), and so does an ``audit.left_out`` line when the party stops. The
party's metrics count every refusal either way. Every accepted upload, job, result and
failure is written, always.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# what a caller can make the party write as often as it likes, by being refused
RATE_LIMITED = frozenset({"call.refused", "job.refused", "upload.rejected"})
REFUSAL_BURST = 50
REFUSAL_REFILL_SECONDS = 12.0  # after a burst: 300 lines an hour of each event at most


class _Bucket:
    """Lines one refusal event may still write now, and those it was not allowed."""

    def __init__(self, now: float) -> None:
        self.tokens = float(REFUSAL_BURST)
        self.at = now
        self.left_out = 0

    def take(self, now: float) -> bool:
        self.tokens = min(float(REFUSAL_BURST),
                          self.tokens + (now - self.at) / REFUSAL_REFILL_SECONDS)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.left_out += 1
        return False


class AuditLog:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, event: str, **fields: Any) -> None:
        if event in RATE_LIMITED:
            with self._lock:
                now = self._clock()
                bucket = self._buckets.setdefault(event, _Bucket(now))
                if not bucket.take(now):
                    return
                left_out, bucket.left_out = bucket.left_out, 0
            if left_out:
                fields = {**fields, "left_out": left_out}
        self._write(event, fields)

    def flush_left_out(self) -> None:
        """Write how many lines of each refusal event were left out since its last line
        (at stop, so that a flood that ended is counted in the log too)."""
        with self._lock:
            counts = {e: b.left_out for e, b in self._buckets.items() if b.left_out}
            for e in counts:
                self._buckets[e].left_out = 0
        if counts:
            self._write("audit.left_out", {"events": counts})

    def _write(self, event: str, fields: dict[str, Any]) -> None:
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
