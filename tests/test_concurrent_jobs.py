"""Jobs side by side: the gateway's port book (pure), then two jobs through the real
gateway (REST, port 0) and real party daemons (gRPC over mutual TLS, port 0) on MPyC
with tiny tables, gateway and parties allowing two jobs at once; and the gateway's
scheduling against fake parties (order, limit, ports held until every party is final).

Both jobs are seen running on every party at one moment: each party's engine waits
at its start until two runs are under way there (or gives up after a minute) and then
reads the party's own job records. Each result equals the plaintext mirror, and the two
jobs hold different MPC ports on every party. One job at a time (the default) is
covered by test_gateway_contract, test_job_contract and test_gateway_load.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from party_harness import EngineWrapper
from ppfs_gateway.jobs import PortBook
from ppfs_party import state as party_state
from service_fakes import (
    FakeCluster,
    FakeParty,
    RealCluster,
    horizontal_setup,
    make_stack,
    owner_table,
    wait_final,
)

from ppfs.engines.base import Engine, PartyRunResult, PartyRunSpec
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2 as pb

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def test_port_book_never_hands_out_a_held_port() -> None:
    book = PortBook()
    ranges = [(1000, 2), (2000, 2), (3000, 3)]
    one = book.take("one", ranges)
    two = book.take("two", ranges)
    assert one is not None and two is not None
    assert all(a != b for a, b in zip(one, two, strict=True))
    assert book.take("three", ranges) is None  # parties 0 and 1 have no free port left
    assert book.take("one", ranges) == one  # asking again changes nothing
    book.release("one")
    three = book.take("three", ranges)
    assert three is not None and three[:2] == one[:2]
    assert three[2] not in (one[2], two[2])  # rotation: party 2 still had a fresh port
    assert three == (1000, 2000, 3002)
    # a preferred set is taken only when every port is free and in range
    book.release("two")
    four = book.take("four", ranges, prefer=three)  # held by "three": rotation instead
    assert four == (1001, 2001, 3000)
    book.release("four")
    assert book.take("five", ranges, prefer=(1001, 2001, 3000)) == (1001, 2001, 3000)
    assert book.take("six", ranges, prefer=(1001, 2001, 3000)) is None  # none free at 0
    assert book.take("seven", [(1000, 3), *ranges[1:]], prefer=(999, 2000, 3001)) is None


def test_port_book_keeps_ports_of_a_job_found_running() -> None:
    book = PortBook()
    ranges = [(1000, 2), (2000, 2), (3000, 2)]
    book.hold("old", (1000, 2001, 3000))
    new = book.take("new", ranges)
    assert new == (1001, 2000, 3001)
    assert book.take("third", ranges) is None
    assert set(book.holders()) == {"old", "new"}


class MeetingEngine(EngineWrapper):
    """An engine that, before each run, waits until ``together`` runs are under way on
    its party (at most ``seconds``), then notes every job's state as the party's own
    job records give it."""

    def __init__(self, inner: Engine, together: int, seconds: float = 60.0) -> None:
        super().__init__(inner)
        self.together = together
        self.seconds = seconds
        self.active: set[str] = set()
        self.seen: list[dict[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    async def run_party(
        self, spec: PartyRunSpec, progress: Callable[[str], None] | None = None
    ) -> PartyRunResult:
        job_dir = spec.workdir.parent
        self.active.add(job_dir.name)
        self._changed.set()
        self._changed = asyncio.Event()
        try:
            async with asyncio.timeout(self.seconds):
                while len(self.active) < self.together:
                    await self._changed.wait()
        except TimeoutError:
            pass
        self.seen.append({
            f.stem: json.loads(f.read_text()) for f in job_dir.parent.glob("*.json")
        })
        try:
            return await self.inner.run_party(spec, progress)
        finally:
            self.active.discard(job_dir.name)


def test_two_jobs_run_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[MeetingEngine] = []
    usable = party_state.usable_engines

    def meeting(settings: Any) -> dict[str, Engine]:
        engines = {n: MeetingEngine(e, together=2) for n, e in usable(settings).items()}
        made.extend(engines.values())
        return engines  # type: ignore[return-value]

    monkeypatch.setattr(party_state, "usable_engines", meeting)
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",),
                                                 mpc_port_count=4, max_concurrent_jobs=2),
                   max_concurrent_jobs=2)
    try:
        owner, admin = s.client("owner-a"), s.client("admin")
        tables, raws, ids = [], [], []
        for n, (m, p) in enumerate(((12, 3), (10, 4))):
            t = make_table(m, p, seed=20 + n)
            ds = owner.create_dataset(f"study-{n}")["id"]
            owner.upload_table(s.keys["owner-a"], owner_table(t), ds)
            admin.grant(ds, "analyst-1")
            owner.consent(s.keys["owner-a"], ds, "analyst-1", s.keys["analyst-1"].box_public_key)
            exps = np.asarray(owner.get_dataset(ds)["column_exponents"])
            tables.append(t)
            raws.append(FixedPoint().encode(t.x, exps, t.columns))
            ids.append(ds)
        analyst, keys = s.client("analyst-1"), s.keys["analyst-1"]
        with ThreadPoolExecutor(2) as pool:  # both at once
            jobs = list(pool.map(
                lambda n: analyst.submit(keys, [ids[n]], label="label", k=1 + n,
                                         engine="mpyc"), range(2)))
        finals = [wait_final(analyst, j["id"], timeout=240) for j in jobs]
        assert all(f["state"] == "succeeded" for f in finals), finals
        for n, job in enumerate(jobs):  # each as if it ran alone: the mirror's choice
            t = tables[n]
            got = analyst.fetch_result(keys, job["id"])
            ref = mirror(raws[n], t.y, Step2AShape(t.m, t.p, t.n_classes, 1 + n))
            assert got.indices.tolist() == ref.selected.tolist()
        a, b = (j["id"] for j in jobs)
        servers = made[-3:]  # the running parties' engines, Alice, Bob, Carol
        for i, engine in enumerate(servers):
            # at one moment this party's own records had both jobs running
            both = [seen for seen in engine.seen
                    if seen.get(a, {}).get("state") == "running"
                    and seen.get(b, {}).get("state") == "running"]
            assert both, (i, [{k: v["state"] for k, v in seen.items()} for seen in engine.seen])
            assert both[0][a]["mpc_port"] != both[0][b]["mpc_port"]
            base = s.cluster.dep.settings[i].mpc_port_base
            assert {both[0][a]["mpc_port"], both[0][b]["mpc_port"]} <= set(range(base, base + 4))
    finally:
        s.close()


def _wait(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def test_scheduler_order_limit_and_ports_held_until_every_party_is_final(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fake parties with two ports each, the gateway allowing three jobs (so two, the
    port cap): three jobs start in submission order, the third only when a port is
    free at every party, which for a failed job is once its last party reports it
    final, not when the gateway marks it failed."""
    # Carol acknowledges cancels of job 1 but her engine of it goes on (a straggler)
    straggle: set[str] = set()
    cancel = FakeParty.CancelJob

    async def late_cancel(self: FakeParty, request: Any, context: Any) -> Any:
        if self.index == 2 and request.job_id in straggle:
            return pb.CancelJobResponse(state=self.jobs[request.job_id].status.state)
        return await cancel(self, request, context)

    monkeypatch.setattr(FakeParty, "CancelJob", late_cancel)
    cluster = FakeCluster(3, tmp_path)
    cluster.mpc_port_count = 2
    cluster.hold = True  # every job runs until released
    s = make_stack(tmp_path, cluster=cluster, max_concurrent_jobs=3, party_lost_seconds=6.0)
    try:
        _, ids, _ = horizontal_setup(s)
        carol = cluster.parties[2]
        analyst, keys = s.client("analyst-1"), s.keys["analyst-1"]
        jobs = [analyst.submit(keys, ids, label="label", k=1 + n) for n in range(3)]
        one, two, three = (j["id"] for j in jobs)
        straggle.add(one)

        def states() -> list[str]:
            return [analyst.get_job(j)["state"] for j in (one, two, three)]

        _wait(lambda: states()[:2] == ["running", "running"], "jobs 1 and 2 running")
        assert states()[2] == "queued"
        assert all(three not in p.jobs for p in cluster.parties)  # never sent
        for p in cluster.parties:  # the two running jobs on different ports everywhere
            ports = [p.jobs[j].desc.peer_mpc_addresses[p.index] for j in (one, two)]
            assert len(set(ports)) == 2, ports
        # job 1 fails at Alice; Carol's engine of it keeps running after the cancel
        s.loop.run(_set(cluster.parties[0], one, state=pb.JOB_STATE_FAILED,
                        failure=pb.FAILURE_KIND_OWN, error="engine exited with code 1"))
        _wait(lambda: states()[0] == "failed", "job 1 failed")
        _wait(lambda: cluster.parties[1].jobs[one].status.state == pb.JOB_STATE_CANCELLED,
              "Bob cancelled job 1")
        assert carol.jobs[one].status.state == pb.JOB_STATE_RUNNING
        assert states()[2] == "queued"  # a slot is free, but no port at Carol
        assert all(three not in p.jobs for p in cluster.parties)
        # Carol's engine of job 1 ends: its ports come back, job 3 starts on them
        s.loop.run(_set(carol, one, state=pb.JOB_STATE_CANCELLED))
        _wait(lambda: states()[2] == "running", "job 3 running")
        for p in cluster.parties:
            port = p.jobs[three].desc.peer_mpc_addresses[p.index]
            assert port == p.jobs[one].desc.peer_mpc_addresses[p.index]
            assert port != p.jobs[two].desc.peer_mpc_addresses[p.index]
        # its description, pinned with these ports, is what every party was sent
        job3 = analyst.get_job(three)
        for p in cluster.parties:
            blob = p.jobs[three].desc.SerializeToString(deterministic=True)
            assert hashlib.sha256(blob).hexdigest() == job3["description_sha256"]
        s.loop.run(_release(cluster))
        assert wait_final(analyst, two)["state"] == "succeeded"
        assert wait_final(analyst, three)["state"] == "succeeded"
    finally:
        s.close()


async def _set(party: Any, job_id: str, **kw: Any) -> None:
    party.set(job_id, **kw)


async def _release(cluster: FakeCluster) -> None:
    cluster.release.set()
