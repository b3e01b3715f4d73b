"""Peak resident memory of running engine processes, read from Linux's ``/proc``.

``VmHWM`` in ``/proc/<pid>/status`` is the kernel's high-water mark of a process's
resident set since it started its current program (an ``exec`` starts a new one).
It never decreases, so the last value read before the process exits is its peak up
to that read: a watcher that reads it every ``interval`` seconds misses only growth
in the last interval before the exit. Where ``/proc`` is absent (not Linux) or the
process is gone, nothing is recorded (``None``), and a run is never held up by it.

Engine parties start as a small launcher (:mod:`ppfs.engines.pdeathsig`) that then
execs the engine binary in the same process; a read counts only once the process
runs the expected program (its ``Name`` in the status file), so the launcher's own
memory is never taken for the engine's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path

# How often a running party's high-water mark is read: a few reads of a small /proc
# file per interval, negligible beside any engine run.
SAMPLE_SECONDS = 0.1
_COMM_LEN = 15  # the kernel keeps the first 15 bytes of a program's name


def process_name(program: str | Path) -> str:
    """The ``Name`` a process running ``program`` shows in ``/proc/<pid>/status``."""
    return Path(program).name[:_COMM_LEN]


def read_peak_rss(pid: int, name: str | None = None) -> int | None:
    """Process ``pid``'s peak resident set in bytes (``VmHWM``), or None when it is
    gone, not readable, not running ``name`` (a :func:`process_name`) or a zombie."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    own_name: str | None = None
    for line in text.split(b"\n"):
        if line.startswith(b"Name:"):
            own_name = line[5:].strip().decode(errors="replace")
            if name is not None and own_name != name:
                return None
        elif line.startswith(b"VmHWM:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                unit = 1024 if len(parts) < 3 or parts[2].lower() == b"kb" else 1
                return int(parts[1]) * unit
            return None
    return None  # a zombie has no memory lines


class PeakRssWatch:
    """Sample the peak resident set of some processes until cancelled.

    ``targets`` is a callable returning the (key, pid, program name) of each process
    still to watch (so processes that exited are left alone); :attr:`peaks` maps each
    key to the highest value read, absent for a process never read while running its
    program.
    """

    def __init__(
        self,
        targets: Callable[[], Iterable[tuple[int, int, str | None]]],
        interval: float = SAMPLE_SECONDS,
    ) -> None:
        self.targets = targets
        self.interval = interval
        self.peaks: dict[int, int] = {}

    def sample(self) -> None:
        for key, pid, name in self.targets():
            value = read_peak_rss(pid, name)
            if value is not None and value > self.peaks.get(key, 0):
                self.peaks[key] = value

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)


__all__ = ["SAMPLE_SECONDS", "PeakRssWatch", "process_name", "read_peak_rss"]
