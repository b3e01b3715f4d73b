"""`ppfs up` supervises its parties: SIGKILL one during a job; `ppfs up` reports it in
one line naming it and starts it again on the same ports; the job fails naming it (its
peers, which only lost it, are not blamed) within the 60 s the gateway allows; the next
job succeeds and matches the mirror. MPyC, tiny shapes; port 0 for the gateway."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import GatewayClient
from service_fakes import owner_table, wait_final

from ppfs.contract import Reveal
from ppfs.fixedpoint import FixedPoint
from ppfs.keycert import TrustAnchor
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table


def _party_pid(state: Path, index: int) -> int:
    """The pid of the party daemon serving this state directory (from /proc)."""
    want = str(state / "parties").encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"ppfs_party" in argv and b"serve" in argv and any(a.startswith(want)
                                                                   for a in argv)
        if ours and argv[argv.index(b"--index") + 1] == str(index).encode():
            return int(proc.name)
    raise AssertionError(f"no party {index} process")


def test_ppfs_up_restarts_a_killed_party_and_the_job_names_it(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    up = subprocess.Popen(
        [sys.executable, "-m", "ppfs_cli", "up", "--state-dir", str(state), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    err_lines: list[str] = []
    reader = threading.Thread(
        target=lambda: err_lines.extend(iter(up.stderr.readline, "")), daemon=True
    )
    reader.start()
    try:
        url = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not url:
            line = up.stdout.readline()
            if not line:
                break
            if "gateway" in line and "http://" in line:
                url = next(w for w in line.split() if w.startswith("http://"))
        assert url, "".join(err_lines)

        tokens = {t["subject"]: t["token"]
                  for t in json.loads((state / "tokens.json").read_text())}
        keys = {s: ClientKeys.load(state / "keys" / f"{s}.key") for s in tokens}
        trust = TrustAnchor.parse(str(state / "ca" / "ca.pem"))  # the operator's, out of band

        def client(subject: str) -> GatewayClient:
            return GatewayClient(url, tokens[subject], timeout=60, trust=trust)

        owner, admin, analyst = client("owner-a"), client("admin"), client("analyst")
        # the per-job MPC port range is on: four ports per party
        dep = analyst.deployment()
        assert len(dep.parties) == 3
        t = make_table(24, 4, seed=5)
        ds = owner.create_dataset("study")["id"]
        owner.upload_table(keys["owner-a"], owner_table(t), ds)
        admin.grant(ds, "analyst")
        owner.consent(keys["owner-a"], ds, "analyst", keys["analyst"].box_public_key,
                      Reveal.MODEL)

        # a long job (many training epochs on MPyC) that Carol will not finish
        training = {"epochs": 200, "batch_size": 4, "learning_rate": 0.5}
        job = analyst.submit(keys["analyst"], [ds], label="label", k=2, security="passive-3pc",
                             engine="mpyc", training=training)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = analyst.get_job(job["id"])
            if st["state"] == "running" and all(p["progress"] >= 0.1 for p in st["parties"]):
                break
            assert st["state"] in ("queued", "running"), st
            time.sleep(0.2)
        old = _party_pid(state, 2)
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        done = wait_final(analyst, job["id"], timeout=90)
        assert time.monotonic() - killed < 60
        assert done["state"] == "failed"
        assert "Carol" in done["error"], done["error"]
        assert "Alice" not in done["error"] and "Bob" not in done["error"], done["error"]

        # reported in one line naming it, and running again (another process)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("Carol is running again" in ln
                                                      for ln in err_lines):
            time.sleep(0.2)
        died = [ln for ln in err_lines if "Carol died" in ln]
        assert len(died) == 1, err_lines
        assert any("Carol is running again" in ln for ln in err_lines), err_lines
        assert _party_pid(state, 2) != old
        assert up.poll() is None  # the stack stays up

        # the next job succeeds and is the mirror's selection
        job2 = analyst.submit(keys["analyst"], [ds], label="label", k=2, security="passive-3pc",
                              engine="mpyc")
        done = wait_final(analyst, job2["id"], timeout=240)
        assert done["state"] == "succeeded", done
        got = analyst.fetch_result(keys["analyst"], job2["id"])
        exps = np.asarray(analyst.get_dataset(ds)["column_exponents"])
        raw = FixedPoint().encode(t.x, exps, t.columns)
        ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, 2))
        assert got.indices.tolist() == ref.selected.tolist()
        # consecutive jobs ran on different MPC ports of each party's range
        for d in sorted((state / "parties").iterdir()):
            ports = [json.loads((d / "jobs" / f"{j['id']}.json").read_text())["mpc_port"]
                     for j in (job, job2)]
            assert ports[0] != ports[1] and all(ports), (d.name, ports)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
    assert up.returncode == 0, "".join(err_lines)
