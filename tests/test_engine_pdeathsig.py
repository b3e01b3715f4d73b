"""The engine launcher: dies with its parent, and reports its program's peak memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppfs.engines.pdeathsig import command, read_peak_rss

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux process semantics")
LAUNCHER = command()   # the engines' launcher exactly as they are started
SH = "/bin/sh"


def _run(args: list[str]) -> int:
    return subprocess.run([*LAUNCHER, *args], check=False, timeout=60).returncode


def test_without_peak_rss_it_becomes_the_program() -> None:
    assert _run([SH, "-c", "exit 3"]) == 3
    assert _run([]) == 2
    assert _run(["--peak-rss"]) == 2


def test_peak_rss_is_the_programs_exact_high_water_mark(tmp_path: Path) -> None:
    size = 96 << 20
    peak = tmp_path / "peak"
    code = f"b = b'x' * {size}; del b"  # the peak lasts an instant, at the very end
    assert _run(["--peak-rss", str(peak), sys.executable, "-c", code]) == 0
    got = read_peak_rss(peak)
    assert got is not None and size <= got < size + (64 << 20)


def test_exit_code_and_signal_are_the_programs(tmp_path: Path) -> None:
    peak = tmp_path / "peak"
    assert _run(["--peak-rss", str(peak), SH, "-c", "exit 7"]) == 7
    assert (read_peak_rss(peak) or 0) > 0
    peak.unlink()
    assert _run(["--peak-rss", str(peak), SH, "-c", "kill -9 $$"]) == -signal.SIGKILL
    assert (read_peak_rss(peak) or 0) > 0  # reported for a killed program too


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(v) for v in text.split()]


def test_program_dies_with_the_launcher(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [*LAUNCHER, "--peak-rss", str(tmp_path / "peak"), "/bin/sleep", "30"]
    )
    try:
        deadline = time.monotonic() + 10
        while not (kids := _children(launcher.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kids
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        while Path(f"/proc/{kids[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not Path(f"/proc/{kids[0]}").exists()
        assert read_peak_rss(tmp_path / "peak") is None  # killed before it could report
    finally:
        launcher.kill()
        launcher.wait()


def test_read_peak_rss_of_nothing(tmp_path: Path) -> None:
    assert read_peak_rss(tmp_path / "absent") is None
    (tmp_path / "bad").write_text("lots\n")
    assert read_peak_rss(tmp_path / "bad") is None


def test_launcher_imports_only_what_it_needs(tmp_path: Path) -> None:
    """It runs once per party and job: modules such as pathlib or typing would each add
    more to its start-up than the launcher's own work (``-X importtime`` lists every
    module it loads)."""
    peak = tmp_path / "peak"
    proc = subprocess.run([LAUNCHER[0], "-X", "importtime", *LAUNCHER[1:], "--peak-rss",
                           str(peak), SH, "-c", "exit 0"],
                          check=True, timeout=60, capture_output=True, text=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
              if line.startswith("import time:")}
    assert "ctypes" in loaded  # the list is real: prctl needs ctypes
    assert not loaded & {"pathlib", "typing", "contextlib", "signal", "enum"}
    assert read_peak_rss(peak) is not None
