"""`ppfs up` refuses a state directory made for another number of parties: its data sets
are shared for that many, so with a party more or fewer every upload would be inconsistent
(`datasets check`) and every job refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_up_state_dir import _gone, _up, _wait_up

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def test_a_three_party_state_dir_is_not_started_with_four(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    up = _up(state)  # three parties, as `ppfs up` makes by default
    try:
        _wait_up(up)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(60)
        for pid in _gone(state, up.pid, 30):
            os.kill(pid, signal.SIGKILL)
    assert up.returncode == 0
    said = up.stderr.read() if up.stderr else ""  # a Ctrl-C is seen to be taken
    assert "ppfs: stopping the gateway, then the parties" in said, said
    assert f"ppfs: stopped; the state stays in {state}" in said, said
    # (a process of its own: a stack that starts would otherwise run until stopped)
    done = subprocess.run(
        [sys.executable, "-m", "ppfs_cli", "up", "--parties", "4", "--port", "0",
         "--state-dir", str(state)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, err
    assert err[0].startswith(f"ppfs: error: --state-dir {state} holds a 3-party deployment")
    assert "--parties 3" in err[0]
    assert not (state / "parties" / "p3-dave").exists()  # nothing made for a fourth
    assert sorted(p.name for p in (state / "parties").iterdir()) == [
        "p0-alice", "p1-bob", "p2-carol"]


def test_up_takes_no_engine_flag_that_it_would_ignore(tmp_path: Path, capsys: Any) -> None:
    """`ppfs up` runs no job: an --engine given to it did nothing. It is demo-service's."""
    import socket

    from ppfs_cli.main import main

    with socket.socket() as busy:  # (an old `ppfs up` stops here, having started nothing)
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        with pytest.raises(SystemExit) as exc:
            main(["up", "--engine", "mpyc", "--port", port, "--state-dir", str(tmp_path / "s")])
    assert exc.value.code == 2
    assert "unrecognized arguments: --engine" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo-service", "--help"])
    assert "--engine {mp-spdz,mpyc}" in capsys.readouterr().out
