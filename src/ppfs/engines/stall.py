"""Telling a run that waits on a frozen peer from one that computes.

An MPC party whose peer stops answering (its engine suspended, a corrupted party that
keeps its daemon answering but never sends, a machine whose TCP connections stay
open) blocks in a receive: it uses no CPU and prints nothing, until the run's time
limit, hours later. Meanwhile it holds its party's job slot.

A :class:`StallWatch` is fed, every few seconds, each watched party's CPU time
(:func:`sample_tree`: the process it launched and that process's descendants, read
from ``/proc``) and how many bytes the parties have printed. When for ``limit``
seconds no watched process has used more CPU than a small noise allowance and none
has printed, the run is stalled. A peer computing while this party waits looks the
same from here, so the limit must exceed the longest step one party computes while
the others wait (:data:`DEFAULT_STALL_SECONDS`).

Linux only: where ``/proc`` is absent (:func:`proc_available`) there is no watch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# No party computed or printed for this long: the run is stalled. A peer that computes a
# long local step while this party waits looks idle from here; Step 2A's parties compute
# alike (replicated protocols), so such a step is short, far below this even at the
# scale bench's largest shape (m*p = 1e8, passive).
DEFAULT_STALL_SECONDS = 600.0
# how often the engines sample their parties' CPU time (a few /proc files each time)
SAMPLE_SECONDS = 3.0
# CPU a process waiting on a peer may use and still count as idle, as a share of one CPU
# over the sample's interval (a blocked receive uses none; timers and a watchdog little)
NOISE_SHARE = 0.02
# and at least this many CPU seconds per sample (the kernel counts in 10 ms ticks)
NOISE_FLOOR = 0.02

_PROC = "/proc"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_available() -> bool:
    """True when this system has Linux's ``/proc`` with per-process stat files."""
    return os.path.isfile(os.path.join(_PROC, "self", "stat"))


@dataclass(frozen=True)
class TreeSample:
    """One process tree at one moment: its CPU time and whether any of it is stopped."""

    cpu_seconds: float  # user + system time of every process in the tree (all threads)
    stopped: bool  # some process of the tree is stopped (state T: SIGSTOP, SIGTSTP)


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(state, parent pid, CPU seconds) of one process, None when it is gone."""
    try:
        with open(os.path.join(_PROC, str(pid), "stat"), "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # the name (field 2) is in parentheses and may hold anything: split after the last ")"
    fields = raw[raw.rfind(b")") + 2:].split()
    try:
        return (fields[0].decode("ascii", "replace"), int(fields[1]),
                (int(fields[11]) + int(fields[12])) / _TICKS)
    except (IndexError, ValueError):
        return None


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/<pid>/task/*/children``; None where the
    kernel does not offer that file."""
    found: list[int] = []
    try:
        tasks = os.listdir(os.path.join(_PROC, str(pid), "task"))
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(os.path.join(_PROC, str(pid), "task", tid, "children"), "rb") as fh:
                found.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            continue
    return found


def _children_by_scan(pid: int) -> list[int]:
    """The children of ``pid``, by reading every process's parent (the slow way)."""
    found = []
    for name in os.listdir(_PROC):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[1] == pid:
                found.append(int(name))
    return found


def sample_tree(pid: int) -> TreeSample | None:
    """CPU time and stopped state of ``pid`` and all its descendants; None when ``pid``
    is gone or ``/proc`` cannot be read."""
    root = _stat(pid)
    if root is None:
        return None
    cpu, stopped = root[2], root[0] in ("T", "t")
    todo, seen = [pid], {pid}
    while todo:
        parent = todo.pop()
        kids = _children(parent)
        if kids is None:
            kids = _children_by_scan(parent)
        for kid in kids:
            if kid in seen:
                continue
            seen.add(kid)
            st = _stat(kid)
            if st is None:
                continue
            cpu += st[2]
            stopped = stopped or st[0] in ("T", "t")
            todo.append(kid)
    return TreeSample(cpu, stopped)


@dataclass
class StallWatch:
    """The stall decision alone (pure: the caller gives the clock and the samples).

    :meth:`observe` takes, at time ``now``, each watched party's :class:`TreeSample`
    (None: not readable) and the bytes the parties have printed so far. The run
    counts as making progress at a sample where some party's CPU time grew by more
    than the noise allowance for the interval, or the printed count grew; it is
    :attr:`stalled` once ``limit`` seconds passed without progress."""

    limit: float
    noise_share: float = NOISE_SHARE
    noise_floor: float = NOISE_FLOOR
    _last_at: float | None = None
    _last_cpu: dict[int, float] = field(default_factory=dict)
    _last_printed: int = -1
    _progress_at: float | None = None
    _stopped: frozenset[int] = frozenset()

    def observe(self, now: float, samples: Mapping[int, TreeSample | None],
                printed: int) -> None:
        if self._last_at is None or self._progress_at is None:
            self._progress_at = now
        else:
            allowance = max(self.noise_floor, self.noise_share * (now - self._last_at))
            busy = any(
                s is not None and s.cpu_seconds - self._last_cpu.get(i, s.cpu_seconds)
                > allowance
                for i, s in samples.items()
            )
            if busy or printed != self._last_printed:
                self._progress_at = now
        self._last_at = now
        self._last_printed = printed
        self._last_cpu = {i: s.cpu_seconds for i, s in samples.items() if s is not None}
        self._stopped = frozenset(i for i, s in samples.items() if s is not None and s.stopped)

    def idle_seconds(self, now: float) -> float:
        """Seconds since the last progress seen (0 before the first sample)."""
        return 0.0 if self._progress_at is None else now - self._progress_at

    @property
    def last_at(self) -> float:
        """When the last sample was taken (0 before the first)."""
        return 0.0 if self._last_at is None else self._last_at

    @property
    def stalled(self) -> bool:
        """True when the last sample came ``limit`` seconds or more after the last
        progress."""
        return (self._last_at is not None and self._progress_at is not None
                and self._last_at - self._progress_at >= self.limit)

    @property
    def stopped(self) -> frozenset[int]:
        """The watched parties with a stopped process at the last sample."""
        return self._stopped
