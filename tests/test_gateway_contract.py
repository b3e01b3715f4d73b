"""The job contract through the real gateway (REST, uvicorn on port 0) and real party
daemons (gRPC over mutual TLS, port 0) on MPyC with tiny tables:

- two jobs, one session: Bob refuses job 1 while Alice and Carol start it, job 2 is
  submitted at once; job 1 fails naming Bob, no engine of job 1 ends with job 2's, and job
  2's result is the mirror's, blaming nobody;
- a compile slower than the gateway's StartJob deadline (an engine wrapper that waits)
  still succeeds, and the second job of the same shape does not compile again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from party_harness import SlowEngine
from ppfs_party import state as party_state
from service_fakes import RealCluster, Stack, make_stack, owner_table, wait_final

from ppfs.engines.base import Engine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.errors import ParameterError
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def _data(s: Stack, m: int = 12, p: int = 3, seed: int = 4):
    t = make_table(m, p, seed=seed)
    owner, admin = s.client("owner-a"), s.client("admin")
    ds = owner.create_dataset("study")["id"]
    owner.upload_table(s.keys["owner-a"], owner_table(t), ds)
    admin.grant(ds, "analyst-1")
    owner.consent(s.keys["owner-a"], ds, "analyst-1", s.keys["analyst-1"].box_public_key)
    exps = np.asarray(owner.get_dataset(ds)["column_exponents"])
    return t, ds, FixedPoint().encode(t.x, exps, t.columns)


def _check_result(s: Stack, job_id: str, t, raw, k: int) -> None:
    got = s.client("analyst-1").fetch_result(s.keys["analyst-1"], job_id)
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, k))
    assert got.indices.tolist() == ref.selected.tolist()


def _record(s: Stack, party: int, job_id: str) -> dict[str, Any]:
    path = s.cluster.dep.settings[party].state_dir / "jobs" / f"{job_id}.json"
    return dict(json.loads(path.read_text()))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",),
                                                 mpc_port_count=4))
    yield s
    s.close()


def test_refused_job_and_the_next_one_through_the_gateway(stack: Stack) -> None:
    s = stack
    t, ds, raw = _data(s)
    # Bob refuses the first job he is asked to start (the party's own refusal path:
    # audited, answered with an error); every later job he accepts
    runner = s.cluster.servers[1].state.jobs
    accept = runner._accept
    refused: list[str] = []

    def refuse_first(desc: Any, sha256: str) -> Any:
        if not refused:
            refused.append(desc.job_id)
            raise ParameterError("Bob does not take this job")
        return accept(desc, sha256)

    runner._accept = refuse_first  # type: ignore[method-assign]
    analyst = s.client("analyst-1")
    keys = s.keys["analyst-1"]
    one = analyst.submit(keys, [ds], label="label", k=1, engine="mpyc")
    two = analyst.submit(keys, [ds], label="label", k=1, engine="mpyc")  # at once
    first = wait_final(analyst, one["id"], timeout=120)
    second = wait_final(analyst, two["id"], timeout=240)
    assert refused == [one["id"]]
    assert first["state"] == "failed" and "Bob" in first["error"], first
    assert "Alice" not in first["error"] and "Carol" not in first["error"]
    assert second["state"] == "succeeded", second
    assert second["error"] == ""
    assert all(p["state"] == "succeeded" and not p["error"] for p in second["parties"])
    _check_result(s, two["id"], t, raw, 1)
    for i in (0, 2):  # Alice and Carol started job 1; it ended cancelled, never with job 2
        rec = _record(s, i, one["id"])
        assert rec["state"] == "cancelled", rec
        assert rec["mpc_port"] != _record(s, i, two["id"])["mpc_port"]
        audit = [json.loads(x) for x in
                 (s.cluster.dep.settings[i].state_dir / "audit.log").read_text().splitlines()]
        assert ("job.cancel", one["id"]) in {(e["event"], e.get("job_id")) for e in audit}
    assert not (s.cluster.dep.settings[1].state_dir / "jobs" / f"{one['id']}.json").exists() \
        or _record(s, 1, one["id"])["state"] == "cancelled"


def test_compile_slower_than_start_deadline_through_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[SlowEngine] = []

    def usable(settings: Any) -> dict[str, Engine]:
        e = SlowEngine(MpycEngine(), seconds=3.0)
        made.append(e)
        return {"mpyc": e}  # type: ignore[dict-item]

    monkeypatch.setattr(party_state, "usable_engines", usable)
    # the gateway waits at most 1 s for StartJob; the compile takes 3 s more
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",)),
                   party_rpc_seconds=1.0)
    try:
        t, ds, raw = _data(s)
        analyst = s.client("analyst-1")
        keys = s.keys["analyst-1"]
        for _ in range(2):
            job = analyst.submit(keys, [ds], label="label", k=1, engine="mpyc")
            done = wait_final(analyst, job["id"], timeout=240)
            assert done["state"] == "succeeded", done
            _check_result(s, job["id"], t, raw, 1)
        servers = made[-3:]  # the engines of the running servers (set-up made the others)
        assert [len(e.compiles) for e in servers] == [1, 1, 1]
    finally:
        s.close()
