"""The client's command line (`ppfs upload`, `ppfs jobs ...`, `ppfs result fetch`)
against a live gateway in front of fake parties, and `ppfs up` / `ppfs demo-service`
as processes with the real party daemons."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ppfs_cli.main import main
from service_fakes import Stack, make_stack
from service_fakes import run_cli as run

from ppfs import oracle
from ppfs.synthetic import make_table


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("cli"))
    yield s
    s.close()


def write_csv(
    path: Path, t, rows: slice, cols: list[int] | None = None, label: bool = True
) -> None:
    cols = list(range(t.p)) if cols is None else cols
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*(t.columns[j] for j in cols), *(["label"] if label else [])])
        for i in range(t.m)[rows]:
            w.writerow([*(repr(float(t.x[i, j])) for j in cols), *([t.y[i]] if label else [])])


def test_cli_main_flow(stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = make_table(40, 6, seed=21)
    write_csv(tmp_path / "a.csv", t, slice(0, 20))
    write_csv(tmp_path / "b.csv", t, slice(20, 40))
    rc, out, _ = run(
        capsys,
        stack,
        "owner-a",
        "upload",
        str(tmp_path / "a.csv"),
        "--dataset",
        "clinic-a",
        "--label",
        "label",
    )
    assert rc == 0
    ds_a = out.strip()
    rc, out, _ = run(capsys, stack, "admin", "datasets", "grant", ds_a, "owner-b")
    assert rc == 0
    # the second owner adds its rows to the same data set, with its schema
    rc, out, err = run(
        capsys,
        stack,
        "owner-b",
        "upload",
        str(tmp_path / "b.csv"),
        "--into",
        ds_a,
        "--label",
        "label",
    )
    assert rc == 0, err
    assert "40 rows in total" in err
    rc, _, _ = run(capsys, stack, "admin", "datasets", "grant", ds_a, "analyst-1")
    rc, out, _ = run(capsys, stack, "analyst-1", "datasets", "list", "--json")
    assert [d["id"] for d in json.loads(out)] == [ds_a]
    rc, out, err = run(
        capsys,
        stack,
        "analyst-1",
        "jobs",
        "submit",
        "--dataset",
        ds_a,
        "--label",
        "label",
        "--k",
        "2",
        "--engine",
        "mpyc",
        "--watch",
    )
    assert rc == 0, err
    assert "succeeded" in out and "Alice: succeeded" in out
    rc, out, _ = run(capsys, stack, "analyst-1", "jobs", "list", "--json")
    job_id = json.loads(out)[-1]["id"]
    rc, out, err = run(
        capsys,
        stack,
        "analyst-1",
        "result",
        "fetch",
        job_id,
        "--json",
    )
    assert rc == 0, err
    got = json.loads(out)
    want = oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 2)
    assert got["selected"] == [t.columns[j] for j in want]
    assert "reduced" not in got  # D' never leaves MPC in service mode
    # someone else's key cannot open it
    rc, _, err = run(capsys, stack, "owner-a", "result", "fetch", job_id)
    assert rc == 2 and "no job" in err


def test_cli_errors(stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,label\n1,x,0\n2,3,1\n")
    rc, _, err = run(
        capsys, stack, "owner-a", "upload", str(bad), "--dataset", "d", "--label", "label"
    )
    assert rc == 2 and "column 'b', row 1" in err
    rc, _, err = run(capsys, stack, "owner-a", "jobs", "show", "nope")
    assert rc == 2 and "no job" in err
    os.environ.pop("PPFS_TOKEN", None)
    assert main(["datasets", "list", "--gateway", stack.gateway.url]) == 2
    assert "no token" in capsys.readouterr().err


def test_ppfs_up_and_demo_service(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ppfs_cli",
            "up",
            "--state-dir",
            str(tmp_path / "stack"),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = up.stdout.readline() if up.stdout else ""
            if not line:
                break
            lines.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "gateway" in text, text + (up.stderr.read() if up.poll() is not None else "")
        url = next(w for w in text.split() if w.startswith("http://"))
        tokens = json.loads((tmp_path / "stack" / "tokens.json").read_text())
        assert oct((tmp_path / "stack" / "tokens.json").stat().st_mode & 0o777) == "0o600"
        admin = next(t["token"] for t in tokens if t["role"] == "admin")
        r = httpx.get(url + "/v1/deployment", headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200 and len(r.json()["parties"]) == 3
        assert httpx.get(url + "/openapi.json").status_code == 200
        assert httpx.get(url + "/docs").status_code == 404  # no page with a CDN's script
        # the clients' trust anchor is in every env file: the development CA certificate
        env_file = (tmp_path / "stack" / "env" / "analyst.env").read_text()
        anchor = env_file.split("PPFS_DEPLOYMENT_CA=")[1].split()[0]
        assert Path(anchor) == (tmp_path / "stack" / "ca" / "ca.pem").resolve()
        assert all(p["key_statement"] for p in r.json()["parties"])
        for t in tokens:  # tokens never reach a log
            for log in (tmp_path / "stack" / "logs").glob("*.log"):
                assert t["token"] not in log.read_text()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
    assert up.returncode == 0
    demo = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppfs_cli",
            "demo-service",
            "--parties",
            "4",
            "--rows",
            "60",
            "--cols",
            "8",
            "--k",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "selected 3 of 8 features" in demo.stdout


def test_private_files_are_0600_whatever_was_there(tmp_path: Path) -> None:
    """Key files, mask words and kept requests are written 0600 through a fresh file
    of their own: not through a leftover or planted file of a looser mode, whose mode
    a rename would carry over, nor through a link."""
    import numpy as np
    from ppfs_client.keys import ClientKeys

    from ppfs.contract import SignedRequest

    key = tmp_path / "me.key"
    for name in ("me.key", "me.key.tmp"):  # a leftover key file and temp file, both 0644
        (tmp_path / name).write_text("{}")
        os.chmod(tmp_path / name, 0o644)
    (tmp_path / "elsewhere").write_text("not a key")
    os.symlink(tmp_path / "elsewhere", tmp_path / ".me.key.tmp")
    keys = ClientKeys.generate("owner-a").save(key)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert ClientKeys.load(key).verify_key == keys.verify_key
    assert (tmp_path / "elsewhere").read_text() == "not a key"
    masks = keys.save_mask_words("m1", np.arange(4))
    masks.chmod(0o644)
    keys.save_mask_words("m1", np.arange(4))
    kept = keys.save_job_request("j1", SignedRequest(b"asked", b"sig"))
    assert kept is not None
    for path in (masks, kept):
        assert oct(path.stat().st_mode & 0o777) == "0o600", path
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700", path
    assert keys.load_job_request("j1") == SignedRequest(b"asked", b"sig")
    assert keys.load_job_request("j2") is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [
        ".me.key.tmp", "me.key.tmp"]  # nothing of its own left behind
