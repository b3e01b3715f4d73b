"""`ppfs select` when one of its local MP-SPDZ parties is frozen mid-run (its binary
SIGSTOPped): the others block on it, using no CPU and printing nothing, and would wait
for the run's time limit (hours). The stall watch stops the run once no party computed
or printed for --stall-timeout seconds, naming the stopped party, and leaves no engine
process behind."""

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

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.engines.stall import proc_available
from ppfs.synthetic import make_table

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
pytestmark = [
    pytest.mark.mpspdz,
    pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}"),
    pytest.mark.skipif(not proc_available(), reason="no Linux /proc: the stall watch is off"),
]

STALL = 4  # --stall-timeout of the runs here
# the command must end this soon after the freeze: the stall limit, a few samples (3 s
# apart) and the parties' stop; without the watch it would wait for its 4 h limit
BOUND = 40.0


def _party_binary(root: Path, party: int) -> int | None:
    for pid in processes_in(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"-party.x") and argv[1:3] == [b"-p", str(party).encode()]:
            return pid
    return None


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    table = make_table(20000, 40, seed=5)
    csv = tmp_path_factory.mktemp("data") / "data.csv"
    csv.write_text(",".join([*table.columns, "y"]) + "\n" + "".join(
        ",".join([*(f"{v:.4f}" for v in row), str(y)]) + "\n"
        for row, y in zip(table.x, table.y, strict=True)))
    return csv


@pytest.mark.timeout(300)
@pytest.mark.parametrize("security,victim", [
    ("passive-3pc", 1), ("active-3pc", 2), ("active-4pc", 3)])
def test_select_ends_naming_the_frozen_party(
    tmp_path: Path, data: Path, security: str, victim: int,
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PPFS_MPSPDZ_CACHE": str(tmp_path / "cache")}
    ppfs = str(Path(sys.executable).parent / "ppfs")
    cmd = [ppfs, "select", str(data), "--label", "y", "--k", "3", "--security", security,
           "--train", "--epochs", "40", "--stall-timeout", str(STALL)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[bytes] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, b"")),
                              daemon=True)
    reader.start()
    pid = None
    try:
        # frozen once the program has reported how far it is: past its connections
        deadline = time.monotonic() + 180  # compiling each program takes a while
        while not any(b"of the secure computation" in ln for ln in lines):
            assert proc.poll() is None, b"".join(lines).decode()
            assert time.monotonic() < deadline, b"".join(lines).decode()
            time.sleep(0.02)
        pid = _party_binary(tmp, victim)
        assert pid is not None, "the victim's MP-SPDZ party is not running"
        os.kill(pid, signal.SIGSTOP)
        t_freeze = time.monotonic()
        try:
            proc.wait(timeout=BOUND + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ppfs select still waits on the frozen party {BOUND + 20:g} s later")
        took = time.monotonic() - t_freeze
        reader.join(5)
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = b"".join(lines).decode()
    name = ("Alice", "Bob", "Carol", "Dave")[victim]
    assert proc.returncode == 1, text
    assert STALL <= took < BOUND, (took, text)
    assert f"secure run failed (party {name})" in text, text
    assert f"made no progress for {STALL} s" in text, text
    assert f"party {victim} ({name}) is stopped" in text, text
    assert list(tmp.iterdir()) == []  # the parties' directories are gone
    assert processes_in(tmp_path) == []  # the frozen party too
