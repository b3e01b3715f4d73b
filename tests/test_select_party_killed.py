"""`ppfs select` when one of its local MP-SPDZ parties dies mid-run: the command ends
within a bounded time, names the party, removes its temporary directory (every party's
shares and keys) and leaves no engine process behind; it says that the parties' logs
went with that directory and how to keep them."""

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


def _party_binary(root: Path, party: int) -> int | None:
    for pid in processes_in(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"-party.x") and argv[1:3] == [b"-p", str(party).encode()]:
            return pid
    return None


@pytest.mark.mpspdz
@pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")
def test_select_ends_naming_the_killed_party_and_cleans_up(tmp_path: Path) -> None:
    table = make_table(3000, 30, seed=5)
    csv = tmp_path / "data.csv"
    csv.write_text(",".join([*table.columns, "y"]) + "\n" + "".join(
        ",".join([*(f"{v:.4f}" for v in row), str(y)]) + "\n"
        for row, y in zip(table.x, table.y, strict=True)))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PPFS_MPSPDZ_CACHE": str(tmp_path / "cache")}
    ppfs = str(Path(sys.executable).parent / "ppfs")
    cmd = [ppfs, "select", str(csv), "--label", "y", "--k", "3",
           "--security", "active-3pc", "--train", "--epochs", "40"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        victim = None
        deadline = time.monotonic() + 120
        while victim is None and proc.poll() is None and time.monotonic() < deadline:
            victim = _party_binary(tmp, 1)
            time.sleep(0.05)
        assert victim is not None, "Bob's MP-SPDZ party never ran"
        time.sleep(0.5)  # in the middle of the secure computation
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode()
    assert proc.returncode == 1, text
    assert took < 30, text
    assert "secure run failed (party Bob)" in text and "killed by signal 9" in text, text
    assert list(tmp.iterdir()) == []  # the parties' directories are gone
    assert processes_in(tmp_path) == []
    # told that the log it names is gone with the directory, and how to keep it
    assert "rerun with --workdir DIR to keep them" in text, text
