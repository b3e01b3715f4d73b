"""Small local-I/O helpers shared by the engines, the party daemon and the tools.

``write_durable`` is how every state file is written: a reader sees the old file or
the whole new one, never a torn write, and the new one survives a crash once the
call returns. ``write_atomic`` is the same without the sync, for a run's scratch files.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write to a unique temporary file, fsync it, rename it over ``path``, fsync the dir."""
    write_durable_parts(path, [data])


def write_durable_parts(path: Path, parts: Iterable[bytes | memoryview]) -> None:
    """:func:`write_durable` of the concatenated ``parts``, written one after the other
    (a large file need not exist as one bytes object first)."""
    _write_replace(path, parts, sync=True)
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """As :func:`write_durable` (a reader sees the old file or the whole new one) but
    without syncing to disk: for files that need not outlive a crash."""
    write_atomic_parts(path, [data])


def write_atomic_parts(path: Path, parts: Iterable[bytes | memoryview]) -> None:
    """:func:`write_atomic` of the concatenated ``parts``."""
    _write_replace(path, parts, sync=False)


def _write_replace(path: Path, parts: Iterable[bytes | memoryview], *, sync: bool) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            for part in parts:
                fh.write(part)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct TCP ports the kernel reports free now (bound and released at once)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
