"""Peak resident memory of engine processes, read from /proc while they run."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from ppfs.engines.peakrss import PeakRssWatch, process_name, read_peak_rss

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").is_file(), reason="needs Linux's /proc"
)


def _own_name() -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Name:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Name line")


def test_reads_own_high_water_mark_and_checks_the_program_name() -> None:
    peak = read_peak_rss(os.getpid())
    assert peak is not None and peak > 1 << 20
    assert read_peak_rss(os.getpid(), _own_name()) is not None
    assert read_peak_rss(os.getpid(), "no-such-program") is None


def test_gone_process_reads_as_none() -> None:
    assert read_peak_rss(2**22 + 12345) is None  # above the kernel's pid limit


def test_process_name_is_the_kernels_first_15_bytes() -> None:
    assert process_name("/opt/mp-spdz/replicated-ring-party.x") == "replicated-ring"
    assert process_name(Path("bin/sleep")) == "sleep"


async def _watch(argv: list[str], name: str | None) -> tuple[dict[int, int], int]:
    proc = await asyncio.create_subprocess_exec(*argv)
    watch = PeakRssWatch(
        lambda: [(0, proc.pid, name)] if proc.returncode is None else [], interval=0.02
    )
    task = asyncio.ensure_future(watch.run())
    code = await proc.wait()
    task.cancel()
    return watch.peaks, code


def test_watch_sees_a_child_reach_its_peak() -> None:
    size = 96 << 20
    code = f"b = b'x' * {size}; import time; time.sleep(0.5)"
    peaks, rc = asyncio.run(_watch([sys.executable, "-c", code], None))
    assert rc == 0
    assert peaks[0] >= size


def test_watch_counts_only_the_program_the_launcher_execs() -> None:
    # the launcher (a Python process) execs `sleep`: only reads of `sleep` count
    sleep = "/bin/sleep" if Path("/bin/sleep").is_file() else "/usr/bin/sleep"
    argv = [sys.executable, "-m", "ppfs.engines.pdeathsig", sleep, "0.5"]
    peaks, rc = asyncio.run(_watch(argv, process_name(sleep)))
    assert rc == 0
    assert 0 < peaks[0] < 8 << 20  # sleep's MB or two, not the interpreter's ten or more
