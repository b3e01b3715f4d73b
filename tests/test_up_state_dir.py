"""`ppfs up` owns its state directory and its daemons.

- A second `ppfs up`, party daemon or gateway on a state directory in use is refused at
  once, in one line naming the directory; the running stack is untouched.
- The daemons die with `ppfs up`: killed by SIGKILL once up, or sent SIGTERM while it
  starts (it then stops what it started and exits 0).
- Common mistakes (a port out of range, a --state-dir that is a file, a damaged
  tokens.json) are one line, not a traceback; tokens.json is replaced, never rewritten
  in place.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ppfs_cli.devstack import _write_private, prepare
from ppfs_cli.main import main

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def _daemons(state: Path, but: int) -> list[int]:
    """PIDs of the processes (other than ``but``) whose arguments name a path in ``state``."""
    want = str(state).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == but:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if "State:\tZ" not in status and any(a.startswith(want) for a in argv):
            found.append(int(proc.name))
    return found


def _gone(state: Path, but: int, timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _daemons(state, but)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _up(state: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ppfs_cli", "up", "--state-dir", str(state), "--port", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _wait_up(up: subprocess.Popen[str]) -> str:
    url, lines = "", []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = up.stdout.readline() if up.stdout else ""
        if not line:
            break
        lines.append(line)
        if line.split()[:1] == ["gateway"]:
            url = next(w for w in line.split() if w.startswith("http://"))
        if "Ctrl-C" in line:
            return url
    raise AssertionError("".join(lines) + (up.stderr.read() if up.stderr else ""))


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str], str]]:
    state = tmp_path / "stack"
    up = _up(state)
    try:
        url = _wait_up(up)
        yield state, up, url
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(60)
        for pid in _gone(state, up.pid, 30):  # never leave one behind, whatever failed
            os.kill(pid, signal.SIGKILL)


def _refused(argv: list[str]) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()


def test_a_state_dir_in_use_is_refused_at_once(
        running: tuple[Path, subprocess.Popen[str], str]) -> None:
    state, up, url = running
    env_before = (state / "env" / "analyst.env").read_text()
    daemons = sorted(_daemons(state, up.pid))
    assert len(daemons) == 4  # three parties and the gateway

    rc, err = _refused(["-m", "ppfs_cli", "up", "--state-dir", str(state), "--port", "0"])
    assert rc == 1 and len(err) == 1, err
    assert str(state) in err[0] and "in use by another process" in err[0]
    assert f"pid {up.pid}" in err[0] and "--state-dir" in err[0]
    # the same with the default port, which the running stack does not hold
    rc, err = _refused(["-m", "ppfs_cli", "up", "--state-dir", str(state)])
    assert rc == 1 and "in use by another process" in err[0], err

    party = state / "parties" / "p0-alice"
    rc, err = _refused(["-m", "ppfs_party", "serve", "--state-dir", str(party), "--index", "0",
                        "--listen", "127.0.0.1:0"])
    assert rc == 2 and len(err) == 1, err
    assert str(party) in err[0] and "in use by another process" in err[0]

    rc, err = _refused(["-m", "ppfs_cli", "gateway", "serve", "--config",
                        str(state / "gateway" / "gateway.json"), "--port", "0"])
    assert rc == 1 and len(err) == 1, err
    assert str(state / "gateway" / "state") in err[0] and "in use" in err[0]

    # the running stack is untouched: same daemons, same files, still answering
    assert sorted(_daemons(state, up.pid)) == daemons
    assert (state / "env" / "analyst.env").read_text() == env_before
    admin = next(t["token"] for t in json.loads((state / "tokens.json").read_text())
                 if t["subject"] == "admin")
    r = httpx.get(url + "/v1/deployment", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200 and len(r.json()["parties"]) == 3


def test_daemons_die_with_a_killed_ppfs_up(
        running: tuple[Path, subprocess.Popen[str], str]) -> None:
    state, up, _ = running
    assert len(_daemons(state, up.pid)) == 4
    up.kill()
    up.wait(10)
    assert _gone(state, up.pid) == []
    # and the state directory is free again at once
    again = _up(state)
    try:
        _wait_up(again)
    finally:
        again.send_signal(signal.SIGINT)
        again.wait(60)
    assert again.returncode == 0


def test_sigterm_while_starting_stops_what_was_started(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    up = _up(state)
    try:
        deadline = time.monotonic() + 120
        while not (state / "run" / "alice.port").exists():  # Alice is up, the rest not yet
            assert up.poll() is None and time.monotonic() < deadline, (
                up.stderr.read() if up.stderr else "")
            time.sleep(0.02)
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        assert up.returncode == 0, up.stderr.read() if up.stderr else ""
        assert _gone(state, up.pid) == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        for pid in _daemons(state, up.pid):
            os.kill(pid, signal.SIGKILL)


# ---- mistakes: one line each --------------------------------------------------------------


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, capsys: Any, port: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", "--port", port, "--state-dir", str(tmp_path / "st")])
    assert exc.value.code == 2
    assert "0..65535" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()


def test_a_state_dir_that_is_a_file_is_named(tmp_path: Path, capsys: Any) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for where in (afile, afile / "below"):
        rc = main(["up", "--port", "0", "--state-dir", str(where)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        assert err[0].startswith(f"ppfs: error: cannot use --state-dir {where}: "), err


def test_a_damaged_tokens_file_is_named_and_never_quoted(tmp_path: Path, capsys: Any) -> None:
    root = tmp_path / "st"
    layout = prepare(root, 3)
    good = layout.tokens_file.read_text()
    entries = json.loads(good)
    damaged = {
        "trailing comma": good.rstrip().rstrip("]").rstrip() + ",]",
        "no admin": json.dumps([e for e in entries if e["subject"] != "admin"]),
        "not a list of entries": json.dumps({"admin": layout.tokens["admin"]}),
    }
    for what, text in damaged.items():
        layout.tokens_file.write_text(text)
        rc = main(["up", "--port", "0", "--state-dir", str(root)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, (what, err)
        assert str(layout.tokens_file) in err[0], (what, err)
        assert "admin" in err[0] or "damaged" in err[0], (what, err)
        assert all(t not in err[0] for t in layout.tokens.values()), what
    assert not (root / "run").exists()  # refused before any daemon started


def test_tokens_file_is_replaced_not_rewritten(tmp_path: Path) -> None:
    """A new file renamed over the old one: a crash mid-write leaves the old one whole
    (here: a hard link to the old file keeps its content)."""
    path, old = tmp_path / "tokens.json", tmp_path / "old"
    old.write_text("old")
    os.link(old, path)
    _write_private(path, "new")
    assert path.read_text() == "new" and old.read_text() == "old"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "tokens.json"]
