"""Load: 20 uploads from different owners at once, then 5 jobs submitted at once, on
the real party daemons; all complete, none is lost or mixed up."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from service_fakes import RealCluster, make_stack, owner_table, wait_final

from ppfs.engines.registry import get_engine
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")

OWNERS = 20
JOBS = 5


def test_concurrent_uploads_and_jobs(tmp_path: Path) -> None:
    engine = "mp-spdz" if get_engine("mp-spdz").unavailable_reason() is None else "mpyc"
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=(engine,)), extra=OWNERS)
    try:
        tables = [make_table(16, 5, seed=100 + i) for i in range(OWNERS)]

        def upload(i: int) -> str:
            c = s.client(f"owner-{i}")
            ds = c.create_dataset(f"load-{i}")
            c.upload_table(s.keys[f"owner-{i}"], owner_table(tables[i]), ds["id"])
            return str(ds["id"])

        with ThreadPoolExecutor(OWNERS) as pool:
            ids = list(pool.map(upload, range(OWNERS)))
        admin = s.client("admin")
        listed = {d["id"]: d for d in admin.list_datasets()}
        assert set(ids) <= set(listed) and len(set(ids)) == OWNERS
        box = s.keys["analyst-1"].box_public_key
        for i, d in enumerate(ids):
            assert listed[d]["owner_id"] == f"owner-{i}" and listed[d]["rows"] == 16
            admin.grant(d, "analyst-1")
            # each owner's consent, checked by every party
            s.client(f"owner-{i}").consent(s.keys[f"owner-{i}"], d, "analyst-1", box)
        # every owner sees exactly its own data set
        for i in (0, 7, 19):
            assert [d["id"] for d in s.client(f"owner-{i}").list_datasets()] == [ids[i]]

        analyst = s.client("analyst-1")
        keys = s.keys["analyst-1"]
        picks = [(j * 3) % OWNERS for j in range(JOBS)]

        def submit(j: int) -> dict:
            return analyst.submit(keys, [ids[picks[j]]], label="label", k=1 + j % 3, engine=engine)

        with ThreadPoolExecutor(JOBS) as pool:
            jobs = list(pool.map(submit, range(JOBS)))
        assert len({j["id"] for j in jobs}) == JOBS
        fp = FixedPoint()
        for j, job in enumerate(jobs):
            done = wait_final(analyst, job["id"], timeout=240)
            assert done["state"] == "succeeded", done
            t = tables[picks[j]]
            exps = np.asarray(listed[ids[picks[j]]]["column_exponents"])
            ref = mirror(
                fp.encode(t.x, exps, t.columns), t.y, Step2AShape(t.m, t.p, t.n_classes, 1 + j % 3)
            )
            got = analyst.fetch_result(keys, job["id"])
            assert got.indices.tolist() == ref.selected.tolist(), (j, job["id"])
            assert got.opened_words == ref.selected.size  # no D'
        assert len(analyst.list_jobs()) == JOBS
    finally:
        s.close()
        shutil.rmtree(tmp_path / "parties", ignore_errors=True)
