"""`ppfs demo-service` killed outright (SIGKILL) cannot remove its temporary state
directory, which holds the development CA's key, every party's keys and their shares:
the next demo removes it, as `ppfs select` does its own runs' (tests/
test_select_crash_leftovers.py). A demo still running holds its directory's lock: its
directory is never removed; nor is a directory that is not a run's."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ppfs.errors import ParameterError

# a demo's directory as a demo makes it: its lock made and held under another name,
# renamed into place, then the demo's secrets written; it prints where, then waits
_DEMO = """
import fcntl, os, sys, tempfile, time
from pathlib import Path
from ppfs.run_dirs import RUN_LOCK
path = Path(tempfile.mkdtemp(prefix="ppfs-demo-"))
fd = os.open(path / ("." + RUN_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.rename(path / ("." + RUN_LOCK), path / RUN_LOCK)
(path / "ca").mkdir()
(path / "ca" / "ca.key").write_text("development CA key")
print(path, flush=True)
time.sleep(600)
"""


def _demo_holding_its_dir(tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", _DEMO], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_the_next_demo_removes_a_killed_demos_directory_and_keeps_a_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppfs_cli import devstack

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    killed, killed_dir = _demo_holding_its_dir(tmp)
    live, live_dir = _demo_holding_its_dir(tmp)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert (killed_dir / "ca" / "ca.key").is_file()  # left behind, its lock free
        other = tmp / "ppfs-not-a-run"  # someone else's folder of the same prefix
        other.mkdir()
        (other / "keep.txt").write_text("x")

        # the next demo: it stops right after making its own directory and claiming it
        made: list[Path] = []

        def claim(root: Path, port: int) -> None:
            made.append(root)
            assert root.is_dir()
            raise ParameterError("stopped here by the test")

        monkeypatch.setattr(devstack, "claim_state_dir", claim)
        args = argparse.Namespace(engine="mpyc", state_dir=None, port=0, parties=3,
                                  max_concurrent_jobs=1)
        with pytest.raises(ParameterError, match="stopped here"):
            asyncio.run(devstack.run_demo(args))

        assert not killed_dir.exists()  # the killed demo's keys and shares are gone
        assert (live_dir / "ca" / "ca.key").is_file()  # a running demo's are not
        assert (other / "keep.txt").read_text() == "x"
        assert made and made[0].parent == tmp and made[0].name.startswith("ppfs-demo-")
        assert not made[0].exists()  # its own, removed as it ended
        assert sorted(p.name for p in tmp.iterdir()) == sorted([live_dir.name, other.name])
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()

    # once the live demo is gone too (killed), the next run removes its directory
    from ppfs.run_dirs import remove_left_behind

    assert remove_left_behind() == [live_dir]
    assert sorted(p.name for p in tmp.iterdir()) == [other.name]
