"""Party daemons as separate processes: restarts and a party killed mid-job."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import pytest
from party_harness import (
    Deployment,
    ProcessCluster,
    identities,
    start_requests,
    watch_to_end,
)
from procs import processes_in

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.step2a import Security
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2, party_pb2_grpc

Stub = party_pb2_grpc.PartyServiceStub
_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()


def _engine_processes(root: Path) -> list[int]:
    return processes_in(root)



def test_party_restarted_between_upload_and_job(tmp_path: Path) -> None:
    table = make_table(30, 5, seed=11)
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))

    async def scenario() -> None:
        cluster = ProcessCluster(dep)
        try:
            for i in range(3):
                await cluster.start(i)
            raw, words, shape = await cluster.upload(table, 2, "mask-1")
            await cluster.send_mask()
            await cluster.stop(1)  # SIGTERM: graceful stop, state on disk
            await cluster.start(1)
            recipient = cluster.recipient.box
            desc = cluster.job("job-1", "mask-1", Security.PASSIVE_3PC, "mpyc", 2, recipient)
            await cluster.run_job(desc, raw, table.y, words, shape, recipient)
        finally:
            await cluster.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("security", "engine"),
    [
        (Security.PASSIVE_3PC, "mpyc"),
        pytest.param(Security.ACTIVE_4PC, "mp-spdz", marks=[
            pytest.mark.mpspdz,
            pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}"),
        ]),
    ],
    ids=["mpyc-passive-3pc", "mpspdz-active-4pc"],
)
def test_party_killed_mid_job_then_resubmitted(security: Security, engine: str,
                                               tmp_path: Path) -> None:
    # big enough that the run is still going when the victim is killed (MP-SPDZ's active
    # 4PC finishes 1,000 x 40 in about half a second on an idle machine: too close to the
    # moment the victim is killed)
    table = make_table(150, 30, seed=12) if engine == "mpyc" else make_table(8000, 60, seed=12)
    small = 2
    n = security.parties
    dep = Deployment.create(tmp_path, n, engines=(engine,), job_timeout=600.0)
    victim = 1
    # MPyC reports its phases: wait for the comparisons; MP-SPDZ reports "running"
    computing = 0.3 if engine == "mpyc" else 0.1

    async def scenario() -> None:
        cluster = ProcessCluster(dep)
        try:
            for i in range(n):
                await cluster.start(i)
            raw, _, shape = await cluster.upload(table, small, "mask-1")
            await cluster.send_mask()
            recipient = cluster.recipient.box
            desc = cluster.job("job-1", "mask-1", security, engine, small, recipient)
            for stub in cluster.stubs:
                await stub.StartJob(start_requests(desc))
            # wait until every party's engine is computing (each party assembles and
            # compiles as the job's first phases, so engines start at different times),
            # then kill the victim's daemon mid-run
            t_wait = time.monotonic()
            while True:
                states = [await stub.GetJob(party_pb2.GetJobRequest(job_id="job-1"))
                          for stub in cluster.stubs]
                for st in states:
                    assert st.state in (party_pb2.JOB_STATE_QUEUED,
                                        party_pb2.JOB_STATE_RUNNING), (st.state, st.error)
                if all(st.state == party_pb2.JOB_STATE_RUNNING and st.progress >= computing
                       for st in states) and all(
                        _engine_processes(s.state_dir) for s in dep.settings):
                    break
                assert time.monotonic() - t_wait < 120
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the engines connect to each other within it
            t0 = time.monotonic()
            await cluster.stop(victim, signal.SIGKILL)
            others = [i for i in range(n) if i != victim]
            finals = await asyncio.wait_for(asyncio.gather(
                *(watch_to_end(cluster.stubs[i], "job-1") for i in others)), 60)
            elapsed = time.monotonic() - t0
            assert all(f.state == party_pb2.JOB_STATE_FAILED for f in finals), finals
            assert elapsed < 60
            # no engine process of any party is left behind (the victim's died with it)
            deadline = time.monotonic() + 10
            while any(_engine_processes(s.state_dir) for s in dep.settings):
                assert time.monotonic() < deadline, [
                    _engine_processes(s.state_dir) for s in dep.settings]
                await asyncio.sleep(0.1)

            await cluster.start(victim)
            st = await cluster.stubs[victim].GetJob(party_pb2.GetJobRequest(job_id="job-1"))
            assert st.state == party_pb2.JOB_STATE_FAILED and st.error == "party restarted"
            # resubmitted (a new job id and fresh masks) after the restart: succeeds
            box = [i.box_public_key for i in await identities(cluster.stubs)]
            words2 = cluster.add_mask(box, shape, "mask-2")
            await cluster.send_mask()
            desc2 = cluster.job("job-2", "mask-2", security, engine, small, recipient)
            await cluster.run_job(desc2, raw, table.y, words2, shape, recipient)
            # a mask is never used twice
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await cluster.stubs[0].StartJob(start_requests(
                    cluster.job("job-3", "mask-2", security, engine, small, recipient)))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await cluster.close()

    asyncio.run(scenario())
