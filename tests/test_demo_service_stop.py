"""`ppfs demo-service` stopped mid-job (SIGTERM, as SIGINT) stops its stack, leaves no
daemon behind and removes its temporary state directory, which holds the development
CA's key, the parties' keys and their shares; it exits 128 + the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_up_state_dir import _gone

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def test_sigterm_mid_job_stops_the_stack_and_removes_its_state(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    demo = subprocess.Popen(
        # MPyC: a job long enough to be stopped while it runs
        [sys.executable, "-m", "ppfs_cli", "demo-service", "--engine", "mpyc"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1"),
    )
    try:
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = demo.stderr.readline() if demo.stderr else ""
            if not line:
                break
            seen.append(line)
            if " running: " in line:
                break
        assert seen and " running: " in seen[-1], "".join(seen)
        assert [p.name[:10] for p in tmp.iterdir()] == ["ppfs-demo-"]
        demo.send_signal(signal.SIGTERM)
        rc = demo.wait(60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
        left = _gone(tmp, demo.pid, 30)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert rc == 128 + signal.SIGTERM
    assert left == []
    assert list(tmp.iterdir()) == []  # no keys, shares or tokens left behind
