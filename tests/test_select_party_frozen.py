"""`ppfs select` when one of its local parties is frozen mid-run (its MP-SPDZ binary or
MPyC worker SIGSTOPped): the others block on it, using no CPU and printing nothing, and
would wait for the run's time limit (hours on MP-SPDZ). The stall watch stops the run
once no party computed or printed for --stall-timeout seconds, naming the stopped
party, and leaves no engine process behind. --timeout sets the whole run's limit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import processes_in

from ppfs.engines.base import PARTY_NAMES
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.engines.stall import proc_available
from ppfs.synthetic import make_table

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
_mpyc_reason = MpycEngine().unavailable_reason()
needs_mpspdz = [
    pytest.mark.mpspdz,
    pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}"),
]
needs_mpyc = pytest.mark.skipif(_mpyc_reason is not None,
                                reason=f"MPyC not available: {_mpyc_reason}")
pytestmark = pytest.mark.skipif(not proc_available(),
                                reason="no Linux /proc: the stall watch is off")

STALL = 4  # --stall-timeout of the runs here
# the command must end this soon after the freeze: the stall limit, a few samples (3 s
# apart) and the parties' stop; without the watch it would wait for its 4 h limit
BOUND = 40.0


def _party_process(root: Path, party: int) -> int | None:
    """The pid of an MP-SPDZ party binary or MPyC worker below ``root``."""
    for pid in processes_in(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"-party.x") and argv[1:3] == [b"-p", str(party).encode()]:
            return pid
        if b"ppfs.engines.mpyc_party" in argv and argv[-2:] == [b"--party",
                                                               str(party).encode()]:
            return pid
    return None


def _csv(path: Path, m: int, p: int) -> Path:
    table = make_table(m, p, seed=5)
    path.write_text(",".join([*table.columns, "y"]) + "\n" + "".join(
        ",".join([*(f"{v:.4f}" for v in row), str(y)]) + "\n"
        for row, y in zip(table.x, table.y, strict=True)))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _csv(tmp_path_factory.mktemp("data") / "data.csv", 20000, 40)


@pytest.fixture(scope="module")
def mpyc_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _csv(tmp_path_factory.mktemp("data") / "data.csv", 3000, 30)


def _start(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], list[bytes], Path]:
    """`ppfs select ARGS` with its own TMPDIR; its stderr lines as they come."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PPFS_MPSPDZ_CACHE": str(tmp_path / "cache")}
    ppfs = str(Path(sys.executable).parent / "ppfs")
    proc = subprocess.Popen([ppfs, "select", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    lines: list[bytes] = []
    assert proc.stderr is not None
    stderr = proc.stderr
    threading.Thread(target=lambda: lines.extend(iter(stderr.readline, b"")),
                     daemon=True).start()
    return proc, lines, tmp


@needs_mpyc
@pytest.mark.timeout(300)
def test_select_on_mpyc_ends_naming_the_frozen_worker(tmp_path: Path, mpyc_data: Path) -> None:
    _frozen_run(tmp_path, [str(mpyc_data), "--label", "y", "--k", "3", "--engine", "mpyc",
                           "--stall-timeout", str(STALL)],
                b"mpyc: mean-split thresholds", 2, "is stopped (its worker process")


@needs_mpyc
@pytest.mark.timeout(300)
def test_select_timeout_sets_the_runs_limit(tmp_path: Path, mpyc_data: Path) -> None:
    proc, lines, _ = _start(tmp_path, [str(mpyc_data), "--label", "y", "--k", "3",
                                       "--engine", "mpyc", "--timeout", "2"])
    t0 = time.monotonic()
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = b"".join(lines).decode()
    assert proc.returncode == 1, text
    assert "secure run failed" in text and "timed out" in text, text
    assert time.monotonic() - t0 < 60, text


@pytest.mark.parametrize("security,victim", [
    pytest.param("passive-3pc", 1, marks=needs_mpspdz),
    pytest.param("active-3pc", 2, marks=needs_mpspdz),
    pytest.param("active-4pc", 3, marks=needs_mpspdz)])
@pytest.mark.timeout(300)
def test_select_ends_naming_the_frozen_party(
    tmp_path: Path, data: Path, security: str, victim: int,
) -> None:
    _frozen_run(tmp_path, [str(data), "--label", "y", "--k", "3", "--security", security,
                           "--train", "--epochs", "40", "--stall-timeout", str(STALL)],
                b"of the secure computation", victim,
                f"party {victim} ({PARTY_NAMES[victim]}) is stopped")


def _frozen_run(tmp_path: Path, args: list[str], started: bytes, victim: int,
                says: str) -> None:
    """Run `ppfs select ARGS`, freeze party ``victim`` once a stderr line holds
    ``started``, and check the command ends within BOUND naming it (``says``)."""
    proc, lines, tmp = _start(tmp_path, args)
    pid = None
    try:
        # frozen once the program has reported how far it is: past its connections
        deadline = time.monotonic() + 180  # compiling each program takes a while
        while not any(started in ln for ln in lines):
            assert proc.poll() is None, b"".join(lines).decode()
            assert time.monotonic() < deadline, b"".join(lines).decode()
            time.sleep(0.02)
        pid = _party_process(tmp, victim)
        assert pid is not None, "the victim's party process is not running"
        os.kill(pid, signal.SIGSTOP)
        t_freeze = time.monotonic()
        try:
            proc.wait(timeout=BOUND + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ppfs select still waits on the frozen party {BOUND + 20:g} s later")
        took = time.monotonic() - t_freeze
        time.sleep(0.5)  # the last of its stderr
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = b"".join(lines).decode()
    name = PARTY_NAMES[victim]
    assert proc.returncode == 1, text
    assert STALL <= took < BOUND, (took, text)
    assert f"secure run failed (party {name})" in text, text
    assert f"made no progress for {STALL} s" in text, text
    assert says in text, text
    assert list(tmp.iterdir()) == []  # the parties' directories are gone
    assert processes_in(tmp_path) == []  # the frozen party too
