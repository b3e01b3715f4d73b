"""Small local-I/O helpers shared by the engines, the party daemon and the tools.

``write_durable`` is how every state file is written: a reader sees the old file or
the whole new one, never a torn write, and the new one survives a crash once the
call returns. ``write_atomic`` is the same without the sync, for a run's scratch files.
Both write files readable by their owner only (0600).

``free_ports`` asks the kernel for free ports (from the ephemeral range);
``free_port_ranges`` picks runs of consecutive ports below that range, for listeners
that are bound later or again and again (MPC ports): an outgoing connection takes its
local port from the ephemeral range, so it can never take one of those meanwhile.
"""

from __future__ import annotations

import os
import secrets
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


def write_replacing(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` (new, or over the old one) with ``mode`` from its first byte:
    through a fresh, randomly named file created exclusively (never one that was there
    before, whatever its mode, nor a link), synced, then renamed over ``path`` (a link
    found there is replaced, never written through), and the rename synced with the
    folder: once it returns, the new file outlives a crash of the machine too."""
    _write_replace(path, [data], sync=True, mode=mode)
    fsync_dir(path.parent)


def _write_replace(path: Path, parts: Iterable[bytes | memoryview], *, sync: bool,
                   mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        # 0600 by default: what is written here is a party's state or its share of
        # someone's data, for the user that runs it alone, whatever the umask and folder
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with open(fd, "wb") as fh:
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


EPHEMERAL_FLOOR = 32768  # Linux's default first ephemeral port
LOW_PORTS = 10000  # ranges are picked from here up to the ephemeral range


def ephemeral_port_floor() -> int:
    """The first port of the ephemeral range (where connect(2) takes local ports)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_FLOOR


def free_port_ranges(ranges: int, count: int, host: str = "") -> list[int]:
    """First ports of ``ranges`` disjoint runs of ``count`` consecutive ports, every port
    free right now on ``host`` (default: every address, the strictest check), all below
    the ephemeral range, in random places (parallel callers rarely meet)."""
    top = ephemeral_port_floor()
    low = LOW_PORTS if top - LOW_PORTS >= 8 * ranges * count else 1024
    if top - low < 2 * ranges * count:
        raise OSError(f"too few ports below the ephemeral range ({top}) for {ranges} "
                      f"ranges of {count}")
    bases: list[int] = []
    taken: set[int] = set()
    for _ in range(1000):
        if len(bases) == ranges:
            return bases
        base = low + secrets.randbelow(top - low - count + 1)
        span = set(range(base, base + count))
        if span & taken:
            continue
        try:
            for port in span:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        bases.append(base)
        taken |= span
    raise OSError(f"no {ranges} free ranges of {count} ports below {top}")
