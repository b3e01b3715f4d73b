"""End to end: client SDK -> gateway (real HTTP, uvicorn on port 0) -> the party
daemons (real gRPC over mutual TLS, port 0) -> an MPC engine, and back to the
recipient. Results are checked against the fixed-point mirror and the oracle."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from service_fakes import RealCluster, make_stack, owner_table, wait_final

from ppfs import oracle
from ppfs.contract import Reveal
from ppfs.engines.registry import get_engine
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def _mpspdz_reason() -> str | None:
    return get_engine("mp-spdz").unavailable_reason()


CASES = [
    pytest.param(3, "mpyc", "passive-3pc", "horizontal", id="mpyc-3pc-horizontal"),
    pytest.param(4, "mpyc", "passive-4pc", "vertical", id="mpyc-4pc-vertical"),
    pytest.param(
        3,
        "mp-spdz",
        "passive-3pc",
        "vertical",
        id="mpspdz-passive3pc-vertical",
        marks=pytest.mark.mpspdz,
    ),
    pytest.param(
        4,
        "mp-spdz",
        "active-4pc",
        "horizontal",
        id="mpspdz-active4pc-horizontal",
        marks=pytest.mark.mpspdz,
    ),
]


@pytest.mark.parametrize(("n", "engine", "security", "combination"), CASES)
def test_service_end_to_end(
    tmp_path: Path, n: int, engine: str, security: str, combination: str
) -> None:
    if engine == "mp-spdz" and (reason := _mpspdz_reason()) is not None:
        pytest.skip(f"MP-SPDZ is not usable here: {reason}")
    s = make_stack(tmp_path, cluster=RealCluster(n, tmp_path, engines=(engine,)))
    try:
        m, p, k = 24, 6, 2
        t = make_table(m, p, seed=11)
        a, b, admin = s.client("owner-a"), s.client("owner-b"), s.client("admin")
        fp = FixedPoint()
        if combination == "horizontal":
            ds_a = a.create_dataset("a")
            a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 12)), ds_a["id"])
            admin.grant(ds_a["id"], "owner-b")
            exps = np.asarray(b.get_dataset(ds_a["id"])["column_exponents"])
            ds_b = b.create_dataset("b")
            b.upload_table(
                s.keys["owner-b"], owner_table(t, slice(12, m)), ds_b["id"], exponents=exps
            )
            raw = fp.encode(t.x, exps, t.columns)
        else:
            ca, cb = list(range(p // 2)), list(range(p // 2, p))
            ds_a = a.create_dataset("a")
            a.upload_table(s.keys["owner-a"], owner_table(t, cols=ca), ds_a["id"])
            ds_b = b.create_dataset("b")
            b.upload_table(s.keys["owner-b"], owner_table(t, cols=cb, label=False), ds_b["id"])
            ea = np.asarray(a.get_dataset(ds_a["id"])["column_exponents"])
            eb = np.asarray(b.get_dataset(ds_b["id"])["column_exponents"])
            raw = np.concatenate(
                [
                    fp.encode(t.x[:, ca], ea, t.columns[: p // 2]),
                    fp.encode(t.x[:, cb], eb, t.columns[p // 2 :]),
                ],
                axis=1,
            )
        for d in (ds_a, ds_b):
            admin.grant(d["id"], "analyst-1")
        # each owner consents, with its own key, to what the analyst learns
        box = s.keys["analyst-1"].box_public_key
        a.consent(s.keys["owner-a"], ds_a["id"], "analyst-1", box)
        b.consent(s.keys["owner-b"], ds_b["id"], "analyst-1", box)
        analyst = s.client("analyst-1")
        job = analyst.submit(
            s.keys["analyst-1"],
            [ds_a["id"], ds_b["id"]],
            label="label",
            k=k,
            security=security,
            engine=engine,
            combination=combination,
        )
        progress = [ev["parties"] for ev in analyst.events(job["id"])]
        done = wait_final(analyst, job["id"], timeout=240)
        assert done["state"] == "succeeded", done
        assert progress, "no job events"
        got = analyst.fetch_result(s.keys["analyst-1"], job["id"])
        ref = mirror(raw, t.y, Step2AShape(m, p, t.n_classes, k))
        assert got.indices.tolist() == ref.selected.tolist()
        assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, k).tolist()
        assert got.opened_words == ref.selected.size  # the selection only: D' stays in MPC
        assert all(pp["program_sha256"] for pp in done["parties"])
    finally:
        s.close()
        shutil.rmtree(tmp_path / "parties", ignore_errors=True)


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param("mpyc", id="mpyc"),
        pytest.param("mp-spdz", id="mpspdz", marks=pytest.mark.mpspdz),
    ],
)
def test_service_training_job_delivers_only_the_model(tmp_path: Path, engine: str) -> None:
    """Step 2B through the real parties: the analyst receives the selection and the
    model (which matches the plaintext SGD oracle), never D'."""
    from ppfs import step2b

    if engine == "mp-spdz" and (reason := _mpspdz_reason()) is not None:
        pytest.skip(f"MP-SPDZ is not usable here: {reason}")
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=(engine,)))
    try:
        m, p, k = 24, 5, 2
        t = make_table(m, p, seed=5)
        a, admin = s.client("owner-a"), s.client("admin")
        ds = a.create_dataset("a")
        a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, m)), ds["id"])
        admin.grant(ds["id"], "analyst-1")
        exps = np.asarray(a.get_dataset(ds["id"])["column_exponents"])
        raw = FixedPoint().encode(t.x, exps, t.columns)
        a.consent(s.keys["owner-a"], ds["id"], "analyst-1", s.keys["analyst-1"].box_public_key,
                  Reveal.MODEL)
        analyst = s.client("analyst-1")
        training = {"epochs": 2, "batch_size": 8, "learning_rate": 0.5, "seed": 3}
        job = analyst.submit(
            s.keys["analyst-1"], [ds["id"]], label="label", k=k, engine=engine, training=training
        )
        done = wait_final(analyst, job["id"], timeout=240)
        assert done["state"] == "succeeded", done
        got = analyst.fetch_result(s.keys["analyst-1"], job["id"])
        ref = mirror(raw, t.y, Step2AShape(m, p, t.n_classes, k))
        assert got.indices.tolist() == ref.selected.tolist()
        assert got.opened_words == k + step2b.model_outputs(p, t.n_classes)  # no D'
        params = step2b.TrainParams(epochs=2, batch=8, lr=0.5, seed=3)
        tr = step2b.mirror(raw[:, ref.selected], t.y, t.n_classes, 32, params)
        weights = np.asarray(got.model.weights)
        unselected = [j for j in range(p) if j not in ref.selected]
        assert np.all(weights[:, unselected] == 0)
        tol = step2b.weight_tolerance(tr, params)
        ratio = np.abs(tr.ratio.astype(float)).sum() / 2**16
        beta_ref = np.ldexp(tr.beta.astype(float), -16)
        assert np.all(
            np.abs(np.asarray(got.model.intercepts) - beta_ref) <= tol * (1 + ratio) + 2.0**-16 * k
        )
    finally:
        s.close()
        shutil.rmtree(tmp_path / "parties", ignore_errors=True)


def test_stopped_party_is_named_not_the_peers_that_lost_it(tmp_path: Path) -> None:
    """A party stopped mid-job makes its peers' engines fail too ("a peer stopped
    first"); the job must fail naming the stopped party, within 60 s."""
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",)))
    try:
        m, p = 150, 8
        t = make_table(m, p, seed=8)
        a, admin = s.client("owner-a"), s.client("admin")
        ds = a.create_dataset("a")
        a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, m)), ds["id"])
        admin.grant(ds["id"], "analyst-1")
        a.consent(s.keys["owner-a"], ds["id"], "analyst-1", s.keys["analyst-1"].box_public_key)
        analyst = s.client("analyst-1")
        job = analyst.submit(s.keys["analyst-1"], [ds["id"]], label="label", k=2, engine="mpyc")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until every party's engine runs
            j = analyst.get_job(job["id"])
            if all(pp["state"] == "running" for pp in j["parties"]):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the job never ran on every party")
        time.sleep(0.5)
        stopped_at = time.monotonic()
        s.loop.run(s.cluster.servers[1].stop(0))  # Bob goes away mid-job
        done = wait_final(analyst, job["id"], timeout=90)
        assert done["state"] == "failed"
        assert time.monotonic() - stopped_at < 60
        assert "Bob" in done["error"], done["error"]
    finally:
        s.close()
        shutil.rmtree(tmp_path / "parties", ignore_errors=True)
