"""A party stopped for maintenance (SIGTERM) lets its unfinished jobs end first.

It takes no new job meanwhile (refused, naming the stop), gives the running
ones up to ``--drain-seconds`` and then stops; a second signal, or the time running out,
stops them at once, as before ("party stopped").
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from party_harness import (
    Deployment,
    ProcessCluster,
    SlowEngine,
    fetch_opened,
    identities,
    parties_running_a_long_job,
    start_requests,
    watch_to_end,
)
from ppfs_party import state as party_state

from ppfs.engines.base import Engine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.step2a import Security, mirror, unmask_all
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2

SUCCEEDED, FAILED = party_pb2.JOB_STATE_SUCCEEDED, party_pb2.JOB_STATE_FAILED


def test_a_stopped_party_finishes_its_job_refuses_new_ones_and_exits(tmp_path: Path) -> None:
    async def main() -> None:
        dep = Deployment.create(tmp_path, 3, engines=("mpyc",), drain_seconds=120.0)
        cluster = ProcessCluster(dep)
        try:
            for i in range(3):
                await cluster.start(i)
            table = make_table(48, 6, seed=11)
            raw, words, shape = await cluster.upload(table, 2, "mask-1")
            await cluster.send_mask()
            rec = dep.owners["recipient"].box
            desc = cluster.job("job-drain", "mask-1", Security.PASSIVE_3PC, "mpyc", 2, rec)
            for stub in cluster.stubs:
                await stub.StartJob(start_requests(desc))
            bob = cluster.procs[1]
            assert bob is not None
            bob.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            assert bob.returncode is None  # still there: its job is running
            # no new job while it stops, and the refusal says why
            cluster.add_mask([i.box_public_key for i in await identities(cluster.stubs)],
                             shape, "mask-2")
            late = cluster.job("job-late", "mask-2", Security.PASSIVE_3PC, "mpyc", 2, rec)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await cluster.stubs[1].StartJob(start_requests(late))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "Bob is stopping" in (info.value.details() or "")
            finals = await asyncio.gather(*(watch_to_end(s, desc.job_id)
                                            for s in cluster.stubs))
            assert [f.state for f in finals] == [SUCCEEDED] * 3, [f.error for f in finals]
            # then it stops by itself, as asked
            assert await asyncio.wait_for(bob.wait(), 30) == 0
            # nothing lost: back up, its result part opens to the mirror's selection
            await cluster.start(1)
            ids = await identities(cluster.stubs)
            parts = await fetch_opened(cluster.stubs, ids, desc.job_id, rec)
            out = unmask_all(parts[1], words, shape)
            assert list(out.indices) == list(mirror(raw, table.y, shape).selected)
            log = (tmp_path / "party1.log").read_text()
            assert "letting 1 unfinished job end" in log and "every job ended" in log
        finally:
            await cluster.close()

    asyncio.run(main())


def _slow(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    def usable(settings: Any) -> dict[str, Engine]:
        return {"mpyc": SlowEngine(MpycEngine(), seconds)}  # type: ignore[dict-item]

    monkeypatch.setattr(party_state, "usable_engines", usable)


def test_the_drain_ends_at_its_time_or_at_a_second_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _slow(monkeypatch, 30.0)  # a compile that outlasts every wait here

    async def main() -> None:
        async with parties_running_a_long_job(tmp_path) as parties:
            servers = parties.servers
            # its time runs out: the job is left to the stop, which fails it
            began = time.monotonic()
            await servers[0].drain(1.0, asyncio.Event())
            assert 0.9 < time.monotonic() - began < 10
            assert servers[0].state.jobs.unfinished() == 1
            # a second stop does not wait at all
            now = asyncio.Event()
            now.set()
            began = time.monotonic()
            await servers[1].drain(60.0, now)
            assert time.monotonic() - began < 2
            await parties.stop(0)
            rec = servers[0].state.jobs.get("job-long")
            assert rec.state == "failed" and rec.error == "party stopped"

    asyncio.run(main())



def test_a_job_sent_while_the_party_stops_its_jobs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped without a drain (--drain-seconds 0, or the drain's time over), the party
    stops its unfinished jobs one by one; a job that arrives meanwhile is refused, not
    accepted after the jobs to stop were counted and left running past the stop."""
    _slow(monkeypatch, 30.0)

    async def main() -> None:
        async with parties_running_a_long_job(tmp_path) as parties:
            stub = parties.cluster.stubs[0]
            jobs = parties.servers[0].state.jobs
            real_cancel = jobs.cancel
            refused: list[grpc.aio.AioRpcError] = []

            async def cancel_as_a_job_arrives(job_id: str, **kwargs: Any) -> Any:
                if job_id == "job-long":  # the stop is under way: a job arrives
                    try:
                        await stub.StartJob(start_requests(parties.late))
                    except grpc.aio.AioRpcError as exc:
                        refused.append(exc)
                return await real_cancel(job_id, **kwargs)

            monkeypatch.setattr(jobs, "cancel", cancel_as_a_job_arrives)
            await parties.stop(0)
            assert len(refused) == 1, "a job was accepted while the party stopped"
            assert refused[0].code() == grpc.StatusCode.FAILED_PRECONDITION
            assert jobs.unfinished() == 0

    asyncio.run(main())
