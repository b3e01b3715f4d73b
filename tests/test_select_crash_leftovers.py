"""`ppfs select` killed outright (SIGKILL, the machine's OOM killer) cannot remove its
temporary directory, which holds every party's shares, the recipient's mask shares and
the TLS keys: the next `ppfs select` of the same user removes it. A directory of a run
still going, or one that is not a run's, is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import processes_in

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.synthetic import make_table

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()


def _csv(path: Path, m: int, p: int) -> Path:
    table = make_table(m, p, seed=5)
    path.write_text(",".join([*table.columns, "y"]) + "\n" + "".join(
        ",".join([*(f"{v:.4f}" for v in row), str(y)]) + "\n"
        for row, y in zip(table.x, table.y, strict=True)))
    return path


@pytest.mark.mpspdz
@pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")
def test_the_next_select_removes_what_a_killed_one_left(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PPFS_MPSPDZ_CACHE": str(tmp_path / "cache")}
    ppfs = str(Path(sys.executable).parent / "ppfs")
    big = _csv(tmp_path / "big.csv", 3000, 30)
    proc = subprocess.Popen([ppfs, "select", str(big), "--label", "y", "--k", "3",
                             "--security", "active-3pc", "--train", "--epochs", "40"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not list(
                tmp.glob("ppfs-*/mpspdz/P*/Player-Data/Input-Binary-P*")):
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30  # its parties die with it
    while processes_in(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = list(tmp.glob("ppfs-*"))
    assert len(left) == 1 and list(left[0].glob("p*/inputs/data.shr"))  # shares stay
    other = tmp / "ppfs-not-a-run"  # someone else's folder of the same prefix
    other.mkdir()
    (other / "keep.txt").write_text("x")

    small = _csv(tmp_path / "small.csv", 30, 4)
    done = subprocess.run([ppfs, "select", str(small), "--label", "y", "--k", "2"],
                          env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(p.name for p in tmp.iterdir()) == ["ppfs-not-a-run"]
    assert (other / "keep.txt").read_text() == "x"


def test_a_run_between_making_its_lock_and_locking_it_is_not_taken_for_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run looking for what killed runs left, just as this one makes its lock and
    before it holds it, must not remove this run's directory."""
    import fcntl

    from ppfs import cli, run_dirs

    monkeypatch.setattr(run_dirs.tempfile, "tempdir", str(tmp_path))
    lock = fcntl.flock
    looked: list[bool] = []

    def another_run_looks_first(fd: int, op: int) -> None:
        if not looked:  # this run's own lock: another run looks first
            looked.append(True)
            cli._remove_left_behind()
        lock(fd, op)

    monkeypatch.setattr(run_dirs.fcntl, "flock", another_run_looks_first)
    path, fd = cli._temp_workdir()
    try:
        assert path.is_dir() and (path / run_dirs.RUN_LOCK).exists()
        monkeypatch.setattr(run_dirs.fcntl, "flock", lock)
        cli._remove_left_behind()  # held: left alone
        assert path.is_dir()
    finally:
        os.close(fd)
    cli._remove_left_behind()  # its run gone: removed
    assert not path.exists()
