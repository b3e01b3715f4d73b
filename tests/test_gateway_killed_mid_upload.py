"""The dealer-gateway killed (SIGKILL) in the middle of an upload, with real party daemons
and a real gateway process: Alice and Bob have stored their parts (staged) and Carol's is
still on its way when the gateway dies.

The moment is made, not raced for: Carol's daemon is paused (SIGSTOP) before the upload,
so her part cannot arrive, and the gateway is killed once Alice's and Bob's state
directories hold their staged parts. Then:

- ``ppfs upload`` fails in one line that names the gateway as gone, says the upload did
  not complete and how to tell whether sending it again is safe (no traceback);
- after the gateway restarts on the same state directory, no party and no gateway
  listing counts the half upload: the data set keeps its rows, every party drops its
  staged part within a bounded time, and a job runs on the complete uploads only;
- sending the same file again succeeds, and the data set has its rows exactly once."""

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

import pytest
from ppfs_cli.devstack import StackLayout, prepare
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import GatewayClient
from service_fakes import wait_final

from ppfs.contract import Reveal
from ppfs.durable import free_port_ranges
from ppfs.engines import pdeathsig
from ppfs.engines.base import PARTY_NAMES
from ppfs.keycert import TrustAnchor
from ppfs.synthetic import make_table

MPC_PORTS = 4
START_SECONDS = 60.0


def _write_csv(path: Path, rows: slice) -> None:
    """Rows of one table (so that every slice fits the data set's schema)."""
    t = make_table(20, 3, seed=3)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*t.columns, "label"])
        for i in range(t.m)[rows]:
            w.writerow([*(repr(float(v)) for v in t.x[i]), t.y[i]])


class Deployment:
    """Three party daemons and a gateway, each its own process (dying with the test)."""

    def __init__(self, root: Path) -> None:
        self.layout: StackLayout = prepare(root, 3)
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.parties: list[subprocess.Popen[bytes]] = []
        self.gateway: subprocess.Popen[bytes] | None = None
        self.port = free_port_ranges(1, 1, "127.0.0.1")[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = root / "gateway" / "gateway.json"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as log:
            return subprocess.Popen([*pdeathsig.command(), *argv], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log)

    def _port(self, name: str, proc: subprocess.Popen[bytes], path: Path) -> int:
        deadline = time.monotonic() + START_SECONDS
        while not (path.is_file() and path.read_text().strip()):
            assert proc.poll() is None, (self.logs / f"{name}.log").read_text()
            assert time.monotonic() < deadline, f"{name} did not start"
            time.sleep(0.05)
        return int(path.read_text())

    def start(self) -> None:
        bases = free_port_ranges(3, MPC_PORTS, "127.0.0.1")
        ports = []
        for i, state in enumerate(self.layout.party_dirs):
            name = PARTY_NAMES[i].lower()
            pf = self.root / f"{name}.port"
            proc = self._spawn(name, [
                sys.executable, "-m", "ppfs_party", "serve", "--state-dir", str(state),
                "--index", str(i), "--listen", "127.0.0.1:0", "--port-file", str(pf),
                "--mpc-host", "127.0.0.1", "--mpc-port", str(bases[i]),
                "--mpc-port-count", str(MPC_PORTS), "--mpc-bind-host", "127.0.0.1",
                "--engine", "mpyc",
            ])  # fmt: skip
            self.parties.append(proc)
            ports.append(self._port(name, proc, pf))
        self.config.write_text(json.dumps({
            "state_dir": "state",
            "parties": [{"address": f"127.0.0.1:{p}", "tls_server_name": PARTY_NAMES[i].lower()}
                        for i, p in enumerate(ports)],
            "tls": {"ca_cert": "tls/ca.pem", "client_cert": "tls/gateway.pem",
                    "client_key": "tls/gateway.key"},
            "tokens_file": str(self.layout.tokens_file.resolve()),
            "host": "127.0.0.1",
            "port": self.port,
            "max_concurrent_jobs": 1,
            # Carol, paused, holds the second upload until the gateway is killed: give a
            # silent party's upload part far longer than the test needs to kill it
            "party_rpc_seconds": 30.0,
        }))
        self.start_gateway()

    def start_gateway(self) -> None:
        pf = self.root / "gateway.port"
        pf.unlink(missing_ok=True)
        self.gateway = self._spawn("gateway", [
            sys.executable, "-m", "ppfs_cli", "gateway", "serve", "--config", str(self.config),
            "--port-file", str(pf),
        ])  # fmt: skip
        self._port("gateway", self.gateway, pf)

    def kill_gateway(self) -> None:
        assert self.gateway is not None
        self.gateway.send_signal(signal.SIGKILL)
        self.gateway.wait(10)

    def stop(self) -> None:
        for proc in [*self.parties, *([self.gateway] if self.gateway else [])]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in [*self.parties, *([self.gateway] if self.gateway else [])]:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- what the data owner and the analyst hold --------------------------------------

    def client(self, subject: str) -> GatewayClient:
        return GatewayClient(self.url, self.layout.tokens[subject], timeout=60,
                             trust=TrustAnchor.parse(str(self.root / "ca" / "ca.pem")))

    def keys(self, subject: str) -> ClientKeys:
        return ClientKeys.load(self.layout.key_file(subject))

    def cli_env(self, subject: str) -> dict[str, str]:
        return dict(os.environ, PPFS_GATEWAY=self.url, PPFS_TOKEN=self.layout.tokens[subject],
                    PPFS_KEY=str(self.layout.key_file(subject)),
                    PPFS_DEPLOYMENT_CA=str(self.root / "ca" / "ca.pem"))

    def upload_cli(self, subject: str, csv_path: Path, dataset_id: str
                   ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "ppfs_cli", "upload", str(csv_path), "--into", dataset_id,
             "--label", "label"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=self.cli_env(subject))

    def ids(self, where: str, party: int) -> set[str]:
        d = self.layout.party_dirs[party] / where
        return {p.name for p in d.iterdir() if not p.name.startswith(".")} if d.is_dir() \
            else set()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path / "stack")
    try:
        d.start()
        yield d
    finally:
        d.stop()


def _wait_for(what: str, ok: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.05)


def test_gateway_killed_mid_upload_leaves_no_half_upload_and_a_retry_counts_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    owner, admin, analyst = d.client("owner-a"), d.client("admin"), d.client("analyst")
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    _write_csv(first, slice(0, 12))
    _write_csv(second, slice(12, 20))

    # one complete upload: the data set's rows before the fault
    ds = owner.create_dataset("study")["id"]
    done = d.upload_cli("owner-a", first, ds)
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    complete = set(owner.get_dataset(ds)["upload_ids"])
    assert len(complete) == 1 and owner.get_dataset(ds)["rows"] == 12

    # Carol paused: her part cannot arrive; Alice's and Bob's can
    carol = d.parties[2]
    carol.send_signal(signal.SIGSTOP)
    try:
        upload = d.upload_cli("owner-a", second, ds)
        _wait_for("Alice and Bob hold the second upload's part (staged)",
                  lambda: (d.ids("staged", 0) and d.ids("staged", 1))
                  or upload.poll() is not None, 120)
        assert upload.poll() is None, upload.communicate()
        half = d.ids("staged", 0)
        assert half == d.ids("staged", 1) and not half & complete
        (half_id,) = half
        d.kill_gateway()
        _, err = upload.communicate(timeout=60)
    finally:
        carol.send_signal(signal.SIGCONT)

    # the owner is told, in one line, what happened and what to do
    lines = err.strip().splitlines()
    assert upload.returncode == 1 and len(lines) == 1, err
    line = lines[0]
    assert line.startswith("ppfs: error: ") and "Traceback" not in err, err
    assert line.startswith("ppfs: error: gateway connection lost (0): the gateway at "
                           f"{d.url} dropped the connection before it answered"), line
    assert f"Upload {half_id} into data set {ds} did not complete" in line, line
    assert f"Running the same upload again (--into {ds}) once the gateway answers is " \
        "safe" in line, line
    assert d.layout.tokens["owner-a"] not in err

    # while the gateway is down: the half upload is nowhere part of the data set
    for i in range(3):
        assert d.ids("uploads", i) == complete, PARTY_NAMES[i]
    assert half_id not in d.ids("staged", 2)

    # the gateway restarts on the same state directory: every party drops the half
    # upload (its id refused from now on) within a bounded time
    d.start_gateway()
    _wait_for("every party aborted the half upload",
              lambda: all(half_id in d.ids("aborted", i) and not d.ids("staged", i)
                          for i in range(3)), 30)
    for i in range(3):
        assert d.ids("uploads", i) == complete, PARTY_NAMES[i]
    record = owner.get_dataset(ds)
    assert record["rows"] == 12 and set(record["upload_ids"]) == complete
    check = owner.check_dataset(ds)
    assert check["consistent"], check
    assert {u["upload_id"] for u in check["recorded"]} == complete
    for p in check["parties"]:
        assert {(h["upload_id"], h["status"]) for h in p["held"]} == {
            (u, "committed") for u in complete}, p

    # a job over the data set uses the complete upload only
    admin.grant(ds, "analyst")
    owner.consent(d.keys("owner-a"), ds, "analyst", d.keys("analyst").box_public_key,
                  Reveal.SELECTION)
    job = analyst.submit(d.keys("analyst"), [ds], label="label", k=1,
                         security="passive-3pc", engine="mpyc")
    ended = wait_final(analyst, job["id"], timeout=180)
    assert ended["state"] == "succeeded", ended
    assert ended["m"] == 12, ended
    assert len(analyst.fetch_result(d.keys("analyst"), job["id"]).columns) == 1

    # sending the same file again succeeds; its rows count once
    again = d.upload_cli("owner-a", second, ds)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    record = owner.get_dataset(ds)
    assert record["rows"] == 12 + 8, record
    assert len(record["upload_ids"]) == 2 and half_id not in record["upload_ids"]
    assert owner.check_dataset(ds)["consistent"]
