"""The CLI's main job: bad input is refused in one line with exit code 2, nothing started."""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from ppfs_cli.main import main
from procs import processes_in

from ppfs import oracle
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.synthetic import make_table
from ppfs.table import read_csv

GOOD = "a,b,c,d,y\n" + "".join(
    f"{i},{(i * 7) % 5},{-i * 1e6},{(i % 3) * 0.001},{i % 2}\n" for i in range(30)
)


@pytest.fixture
def good_csv(tmp_path):
    p = tmp_path / "good.csv"
    p.write_text(GOOD)
    return p


@pytest.mark.parametrize(
    "text, extra, message",
    [
        ("a,b,y\n1,x,0\n2,3,1\n3,4,0\n", ["--k", "1"], "column 'b', row 1: 'x' is not numeric"),
        ("a,b,y\n1,2,0\n2,,1\n3,4,0\n", ["--k", "1"], "column 'b', row 2: missing value"),
        ("a,b,y\n1,2,0\n2,3,0\n3,4,0\n", ["--k", "1"], "single class"),
        ("", ["--k", "1"], "empty"),
        ("a,b,y\n1,2,0\n2,3\n", ["--k", "1"], "row 2 has 2 fields"),
    ],
)
def test_bad_input_exit_2(tmp_path, capsys, text, extra, message):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    rc = main(["select", str(p), "--label", "y", *extra, "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "w").exists()  # nothing was started


@pytest.mark.parametrize(
    "args, message",
    [
        (["--label", "nope", "--k", "1"], "label column 'nope' is not in the header"),
        (["--label", "y", "--k", "0"], "good.csv: --k 0: k must be 1 .. 3 (the file has p = 4"),
        (["--label", "y", "--k", "4"], "good.csv: --k 4: k must be 1 .. 3 (the file has p = 4"),
        (
            ["--label", "y", "--k", "1", "--engine", "mpyc", "--security", "active-3pc"],
            "mpyc does not support active-3pc",
        ),
    ],
)
def test_bad_parameters_exit_2(good_csv, tmp_path, capsys, args, message):
    rc = main(["select", str(good_csv), *args, "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert message in err[-1]
    assert not (tmp_path / "w").exists()


def test_select_json_and_out_on_mpyc(good_csv, tmp_path):
    """The whole main job through the installed entry point, on the pure-pip engine."""
    out = tmp_path / "reduced.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppfs_cli",
            "select",
            str(good_csv),
            "--label",
            "y",
            "--k",
            "2",
            "--engine",
            "mpyc",
            "--json",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    t = read_csv(good_csv, "y")
    plain = oracle.ms_gini_top_k(t.x, t.y, 2, 2)
    assert res["selected"] == [t.columns[j] for j in plain]
    assert res["k"] == 2 and res["security"] == "passive-3pc" and res["engine"] == "mpyc"
    assert res["parties"] == 3 and res["seconds"] > 0 and res["bytes_sent"] >= 0
    # where the time outside the engine went
    assert res["compile_seconds"] >= 0
    assert sorted(res["phase_seconds"]) == ["decode", "encode_share", "engine_setup", "read"]
    assert all(v >= 0 for v in res["phase_seconds"].values())
    assert "engine mpyc" in proc.stderr
    reduced = read_csv(out, "y")
    assert list(reduced.columns) == res["selected"]
    np.testing.assert_allclose(reduced.x, t.x[:, plain], rtol=0, atol=1e6 * 2.0**-16)


_mpspdz_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()


@pytest.mark.mpspdz
@pytest.mark.skipif(_mpspdz_reason is not None,
                    reason=f"MP-SPDZ not available: {_mpspdz_reason}")
def test_select_with_relative_workdir_and_cache_on_mpspdz(good_csv, tmp_path, monkeypatch,
                                                          capsys):
    """Relative --workdir and $PPFS_MPSPDZ_CACHE: each party runs with its own directory
    as cwd, where a relative path would name another place; the run still succeeds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PPFS_MPSPDZ_CACHE", "cache")
    rc = main(["select", good_csv.name, "--label", "y", "--k", "2", "--engine", "mp-spdz",
               "--json", "--workdir", "wd/run"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    t = read_csv(good_csv, "y")
    plain = oracle.ms_gini_top_k(t.x, t.y, 2, 2)
    assert json.loads(out)["selected"] == [t.columns[j] for j in plain]
    assert list((tmp_path / "cache").iterdir())  # the program was compiled there


def test_kept_workdir_is_readable_by_its_user_alone(good_csv, tmp_path, capsys):
    """--workdir keeps every party's shares and the recipient's masks: the folder (one
    that existed too), each party's folders and every share file are the user's alone."""
    work = tmp_path / "w"
    work.mkdir(mode=0o755)
    work.chmod(0o755)
    rc = main(["select", str(good_csv), "--label", "y", "--k", "2", "--engine", "mpyc",
               "--workdir", str(work)])
    assert rc == 0, capsys.readouterr().err
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    shares = sorted(work.glob("p*/inputs/*.shr"))
    assert len(shares) == 9  # data, labels and mask of each of three parties
    for f in shares:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        for d in (f.parent, f.parent.parent):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_terminated_select_removes_its_shares_and_keys(sig, tmp_path):
    """Ended by SIGTERM (timeout, a CI cancel, systemd) or SIGHUP mid-run, `ppfs select`
    still stops its parties and removes its temporary directory, which holds every
    party's shares and TLS key."""
    table = make_table(300, 40, seed=4)  # about 10 s of MPyC comparisons
    data = tmp_path / "data.csv"
    data.write_text("".join(
        ",".join(row) + "\n" for row in [
            [*table.columns, "y"],
            *([*(repr(float(v)) for v in x), table.classes[int(c)]]
              for x, c in zip(table.x, table.y, strict=True))]))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppfs_cli", "select", str(data), "--label", "y", "--k", "2",
         "--engine", "mpyc"],
        env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp.glob("ppfs-*/mpyc/P*/worker.pid"))) < 3:  # every party runs
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert list(tmp.glob("ppfs-*/p*/inputs/data.shr"))
        proc.send_signal(sig)
        assert proc.wait(60) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(tmp.iterdir()) == []
    deadline = time.monotonic() + 10
    while processes_in(tmp):  # the parties' workers went with it
        assert time.monotonic() < deadline, processes_in(tmp)
        time.sleep(0.1)
