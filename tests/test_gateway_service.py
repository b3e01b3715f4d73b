"""The gateway and the client over real HTTP and real gRPC (mutual TLS) against fake
parties that compute in the clear: uploads, jobs, failures, restarts, leakage."""

from __future__ import annotations

import base64
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ppfs_client.sdk import ApiError, GatewayClient
from service_fakes import Stack, horizontal_setup, make_stack, owner_table, wait_final

from ppfs import oracle
from ppfs.fixedpoint import FixedPoint
from ppfs.keycert import TrustAnchor
from ppfs.scoring import Scorer
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path)
    yield s
    s.gateway.stop()
    s.loop.run(s.cluster.stop())
    s.loop.stop()


def test_horizontal_job_matches_oracle(stack: Stack) -> None:
    t, ids, raw = horizontal_setup(stack)
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    job = analyst.submit(keys, ids, label="label", k=3, engine="mpyc")
    states = [ev["state"] for ev in analyst.events(job["id"])]
    assert states[-1] == "succeeded", states
    got = analyst.fetch_result(keys, job["id"])
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, 3))
    assert got.indices.tolist() == ref.selected.tolist()
    assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 3).tolist()
    assert got.columns == [t.columns[j] for j in ref.selected]
    assert got.opened_words == ref.selected.size  # the selection only: D' stays in MPC
    job = analyst.get_job(job["id"])
    assert [p["state"] for p in job["parties"]] == ["succeeded"] * 3
    assert job["m"] == t.m and job["p"] == t.p


@pytest.mark.parametrize("scorer", [Scorer.PEARSON, Scorer.CHI2], ids=lambda s: s.value)
def test_job_with_a_scorer(stack: Stack, scorer: Scorer) -> None:
    """The REST field reaches the parties in the description and comes back in the job."""
    t, ids, raw = horizontal_setup(stack)
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    job = analyst.submit(keys, ids, label="label", k=3, engine="mpyc", scorer=scorer.value)
    assert job["scorer"] == scorer.value
    states = [ev["state"] for ev in analyst.events(job["id"])]
    assert states[-1] == "succeeded", states
    got = analyst.fetch_result(keys, job["id"])
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, 3, scorer=scorer))
    assert got.indices.tolist() == ref.selected.tolist()
    assert got.indices.tolist() == oracle.scorer_top_k(
        scorer.value, raw.astype(np.float64) if scorer is Scorer.PEARSON else t.x, t.y,
        t.n_classes, 3).tolist()
    assert analyst.get_job(job["id"])["scorer"] == scorer.value
    with pytest.raises(ApiError) as info:
        analyst.submit_job({"dataset_ids": ids, "label_column": "label", "k": 3,
                            "scorer": "mutual-information",
                            "recipient_public_key": base64.b64encode(bytes(32)).decode(),
                            "mask_upload_id": "x"})
    assert info.value.status == 422


def test_vertical_job_four_parties(tmp_path: Path) -> None:
    s = make_stack(tmp_path, n=4)
    try:
        t = make_table(30, 8, seed=5)
        a, b, admin = s.client("owner-a"), s.client("owner-b"), s.client("admin")
        ds_a = a.create_dataset("labs")
        a.upload_table(s.keys["owner-a"], owner_table(t, cols=[0, 1, 2, 3]), ds_a["id"])
        ds_b = b.create_dataset("vitals")
        b.upload_table(
            s.keys["owner-b"], owner_table(t, cols=[4, 5, 6, 7], label=False), ds_b["id"]
        )
        for d in (ds_a, ds_b):
            admin.grant(d["id"], "analyst-1")
        analyst = s.client("analyst-1")
        assert analyst.deployment().scheme.value == "rep4"
        job = analyst.submit(
            s.keys["analyst-1"],
            [ds_a["id"], ds_b["id"]],
            label="label",
            k=2,
            security="active-4pc",
            combination="vertical",
        )
        assert wait_final(analyst, job["id"])["state"] == "succeeded"
        got = analyst.fetch_result(s.keys["analyst-1"], job["id"])
        fp = FixedPoint()
        raw = np.concatenate(
            [
                fp.encode(
                    t.x[:, c],
                    np.asarray(analyst.get_dataset(d["id"])["column_exponents"]),
                    [t.columns[j] for j in c],
                )
                for d, c in ((ds_a, [0, 1, 2, 3]), (ds_b, [4, 5, 6, 7]))
            ],
            axis=1,
        )
        ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, 2))
        assert got.indices.tolist() == ref.selected.tolist()
        assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 2).tolist()
    finally:
        s.gateway.stop()
        s.loop.run(s.cluster.stop())
        s.loop.stop()


def test_party_failure_names_the_party(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack)
    stack.cluster.fail_party = 1
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2)
    done = wait_final(analyst, job["id"])
    assert done["state"] == "failed"
    assert "Bob" in done["error"] and "engine exited" in done["error"]
    with pytest.raises(ApiError) as e:
        analyst.result_parts(job["id"])
    assert e.value.status == 409


def test_refused_start_fails_naming_party(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack)
    stack.cluster.refuse_start = 2
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2)
    done = wait_final(analyst, job["id"])
    assert done["state"] == "failed" and "Carol" in done["error"]


def _a_held_job_running(s: Stack) -> tuple[GatewayClient, dict[str, Any]]:
    """Submit a job the fake parties hold running: (the analyst's client, the job)."""
    _, ids, _ = horizontal_setup(s)
    s.cluster.hold = True
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2)
    deadline = time.monotonic() + 10
    while analyst.get_job(job["id"])["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return analyst, job


def test_lost_party_fails_job_in_time(tmp_path: Path) -> None:
    s = make_stack(tmp_path, party_lost_seconds=2.0)
    try:
        analyst, job = _a_held_job_running(s)
        s.loop.run(s.cluster.stop_party(2))
        t0 = time.monotonic()
        done = wait_final(analyst, job["id"], timeout=20)
        assert done["state"] == "failed" and "Carol" in done["error"], done
        assert time.monotonic() - t0 < 10
    finally:
        s.loop.loop.call_soon_threadsafe(s.cluster.release.set)
        s.gateway.stop()
        s.loop.run(s.cluster.stop())
        s.loop.stop()


def test_a_party_whose_address_refuses_connections_fails_its_job_before_the_silence_limit(
    tmp_path: Path,
) -> None:
    """A party daemon that is gone (its port closed: killed, or stopped before its engine
    connected to the others) is named well before the silence limit, which is for a
    party that may still be computing (frozen, overloaded, or cut off from the gateway
    only); a restarted party would fail the job anyway."""
    s = make_stack(tmp_path, party_lost_seconds=60.0)
    try:
        analyst, job = _a_held_job_running(s)
        s.loop.run(s.cluster.stop_party(2))
        t0 = time.monotonic()
        seen = ""
        left: list[tuple[float, int]] = []  # (when seen, seconds left it says)
        while analyst.get_job(job["id"])["state"] == "running":
            seen = analyst.get_job(job["id"])["parties"][2]["phase"] or seen
            said = re.search(r"unless it is back within (\d+) s", seen)
            if said and (not left or left[-1][1] != int(said[1])):
                left.append((time.monotonic(), int(said[1])))
            assert time.monotonic() - t0 < 30, "not named within half the silence limit"
            time.sleep(0.2)
        failed_at = time.monotonic()
        done = analyst.get_job(job["id"])
        assert done["state"] == "failed" and done["error"] == "lost the connection to Carol", done
        assert "its address refuses connections (stopped?)" in seen, seen
        # the time it says is left counts down to the failure, not the whole wait each poll
        assert len(left) >= 2 and [n for _, n in left] == sorted(
            (n for _, n in left), reverse=True), left
        for when, n in left:
            assert failed_at - when <= n + 6, (left, failed_at)  # a poll's slack
    finally:
        s.loop.loop.call_soon_threadsafe(s.cluster.release.set)
        s.gateway.stop()
        s.loop.run(s.cluster.stop())
        s.loop.stop()


def test_cancel_and_restart_reconciles(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack)
    stack.cluster.hold = True
    analyst = stack.client("analyst-1")
    j1 = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2)
    j2 = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=3)
    c = analyst.cancel_job(j1["id"])
    assert c["state"] == "cancelled"
    with pytest.raises(ApiError) as e:
        analyst.cancel_job(j1["id"])
    assert e.value.status == 409
    # the gateway restarts while j2 runs; on start it reconciles with the parties
    stack.restart_gateway()
    analyst = stack.client("analyst-1")
    assert analyst.get_job(j2["id"])["state"] in ("queued", "running")
    stack.loop.loop.call_soon_threadsafe(stack.cluster.release.set)
    assert wait_final(analyst, j2["id"])["state"] == "succeeded"
    assert analyst.get_job(j1["id"])["state"] == "cancelled"
    got = analyst.fetch_result(stack.keys["analyst-1"], j2["id"])
    assert len(got.columns) == 3


def test_disagreeing_parties_are_detected(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack)
    stack.cluster.tamper_result = 2
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2)
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    with pytest.raises(Exception, match="disagree"):
        analyst.fetch_result(stack.keys["analyst-1"], job["id"])


def test_gateway_stores_and_logs_nothing_it_could_open(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    t, ids, raw = horizontal_setup(stack)
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=3)
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    analyst.fetch_result(stack.keys["analyst-1"], job["id"])
    stored = b""
    for f in sorted((stack.root / "gateway").rglob("*")):
        if f.is_file():
            stored += f.read_bytes()
    db = sqlite3.connect(stack.root / "gateway" / "registry.sqlite3")
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'"):
        stored += json.dumps(db.execute(f"SELECT * FROM {table}").fetchall(), default=repr).encode()
    logged = caplog.text.encode()
    for blob in (stored, logged):
        # no plaintext value, in any rendering
        for v in t.x.reshape(-1)[:50]:
            assert repr(float(v)).encode() not in blob
            assert f"{v:.6g}".encode() not in blob
        # no encoded value as 8 raw bytes
        for r in raw.reshape(-1)[:50]:
            assert int(r).to_bytes(8, "little", signed=True) not in blob
        # no share bundle (their magic), no sealed part, no token, no private key
        assert b"PPFSSHR1" not in blob
        for tok in stack.token.values():
            assert tok.encode() not in blob
        for k in stack.keys.values():
            assert bytes(k.box) not in blob
            assert base64.b64encode(bytes(k.box)) not in blob
    # what the parties received from the gateway is exactly what the owners sealed
    headers = stack.cluster.parties[0].received_headers
    assert {h.owner_id for h in headers} >= {"owner-a", "owner-b", "analyst-1"}


def test_gateway_needs_a_certificate_from_the_deployment_ca(tmp_path: Path) -> None:
    """Mutual TLS: a gateway whose client certificate another CA signed gets nothing."""
    from service_fakes import GatewayThread

    from ppfs.pki import CertificateAuthority, party_key_and_csr, write_cert

    s = make_stack(tmp_path)
    try:
        rogue = CertificateAuthority.create("rogue")
        csr = party_key_and_csr(tmp_path / "rogue" / "gw.key", "gateway")
        write_cert(tmp_path / "rogue" / "gw.pem", rogue.issue(csr))
        settings = s.cluster.gateway_settings(tmp_path / "gw2", s.token_config)
        tls = settings.tls.model_copy(
            update={
                "client_cert": tmp_path / "rogue" / "gw.pem",
                "client_key": tmp_path / "rogue" / "gw.key",
            }
        )
        gw = GatewayThread(settings.model_copy(update={"tls": tls, "party_rpc_seconds": 3.0}))
        try:
            c = GatewayClient(gw.url, s.token["admin"],
                              trust=TrustAnchor.parse(str(s.ca_pem)))
            with pytest.raises(ApiError) as e:
                c.deployment()
            assert e.value.status == 502 and "did not answer" in e.value.detail
            assert any(n in e.value.detail for n in ("Alice", "Bob", "Carol"))
        finally:
            gw.stop()
    finally:
        s.close()


def test_training_job_returns_the_model(stack: Stack) -> None:
    """Step 2B parameters travel with the job; the recipient decodes the model (the fake
    parties train in the clear with ppfs.step2b.mirror)."""
    from ppfs import step2b

    t, ids, raw = horizontal_setup(stack, m=40, p=6)
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    training = {"epochs": 2, "batch_size": 8, "learning_rate": 0.5}
    job = analyst.submit(keys, ids, label="label", k=2, training=training)
    assert job["training"] == {**training, "seed": 0, "weight_bits": step2b.WEIGHT_BITS}
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    got = analyst.fetch_result(keys, job["id"])
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, 2))
    assert got.indices.tolist() == ref.selected.tolist()
    assert got.opened_words == 2 + step2b.model_outputs(t.p, t.n_classes)  # no D'
    params = step2b.TrainParams(epochs=2, batch=8, lr=0.5)
    tr = step2b.mirror(raw[:, ref.selected], t.y, t.n_classes, 32, params)
    assert got.model is not None
    weights = np.asarray(got.model.weights)
    unselected = [j for j in range(t.p) if j not in ref.selected]
    assert np.all(weights[:, unselected] == 0)
    assert np.allclose(got.model.intercepts, np.ldexp(tr.beta.astype(float), -16))
    bad = dict(training, learning_rate=50.0)
    with pytest.raises(ApiError) as e:
        analyst.submit(keys, ids, label="label", k=2, training=bad, mask_upload_id="x")
    assert e.value.status == 422


def test_https_gateway(tmp_path: Path) -> None:
    """With https_cert/https_key the REST API (and so every bearer token) runs over TLS."""
    from service_fakes import GatewayThread

    from ppfs.pki import party_key_and_csr, write_cert

    s = make_stack(tmp_path)
    try:
        csr = party_key_and_csr(tmp_path / "https" / "gw.key", "localhost")
        write_cert(tmp_path / "https" / "gw.pem", s.cluster.ca.issue(csr))
        settings = s.cluster.gateway_settings(
            tmp_path / "gw-https",
            s.token_config,
            https_cert=str(tmp_path / "https" / "gw.pem"),
            https_key=str(tmp_path / "https" / "gw.key"),
        )
        gw = GatewayThread(settings)
        try:
            assert gw.url.startswith("https://")
            ca = str(s.cluster.tls_dir / "ca.pem")
            trust = TrustAnchor.parse(ca)
            with GatewayClient(gw.url, s.token["admin"], verify=ca, trust=trust) as c:
                assert len(c.deployment().parties) == 3
            with pytest.raises(ApiError), GatewayClient(gw.url, s.token["admin"],
                                                         trust=trust) as c:
                c.deployment()  # a client that does not trust the deployment CA
        finally:
            gw.stop()
    finally:
        s.close()


def test_parties_start_jobs_in_one_order(stack: Stack) -> None:
    """Jobs submitted at once reach every party in the same order (one at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    _, ids, _ = horizontal_setup(stack)
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    masks = [analyst.create_masks(keys, 2) for _ in range(4)]  # k words: no D' in a service job
    with ThreadPoolExecutor(4) as pool:
        jobs = list(
            pool.map(
                lambda mk: analyst.submit(keys, ids, label="label", k=2, mask_upload_id=mk),
                masks,
            )
        )
    for job in jobs:
        assert wait_final(analyst, job["id"])["state"] == "succeeded"
    orders = [list(p.jobs) for p in stack.cluster.parties]
    assert orders[0] == orders[1] == orders[2]
    assert sorted(orders[0]) == sorted(j["id"] for j in jobs)
    results = {j["id"]: analyst.fetch_result(keys, j["id"]).indices.tolist() for j in jobs}
    assert len({tuple(v) for v in results.values()}) == 1
