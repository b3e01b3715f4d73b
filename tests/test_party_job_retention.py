"""A party prunes the jobs that ended more than ``--job-retention-days`` ago: their
directory (the engine's logs, the opened masked words of the result) is deleted and
their record reduced to a tombstone. What the record protected stays protected: the
job id is refused again, its mask upload serves no other job, and the limited consents
it spent stay spent. A job not yet ended, or ended within the retention, is kept whole;
a fetch of a pruned result says so. The party's clock is injected: nothing sleeps for
a month."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from party_harness import (
    Deployment,
    ProcessCluster,
    SlowEngine,
    describe_job,
    fetch_opened,
    identities,
    start_requests,
    watch_to_end,
)
from ppfs_party.config import DEFAULT_JOB_RETENTION_DAYS, PartySettings
from ppfs_party.server import PartyServer, start_party_server
from ppfs_party.state import open_state

from ppfs.contract import Consent, Reveal
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.errors import ParameterError
from ppfs.step2a import Security
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2, party_pb2_grpc

DAY = 86_400.0
Stub = party_pb2_grpc.PartyServiceStub
# what a pruned job's record keeps: what refuses it again and its public outcome
TOMBSTONE_FIELDS = {
    "job_id", "description_sha256", "state", "ended_at", "pruned_at", "pruned_after_days",
    "mask_upload_id", "spent_consents", "failure",
}


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _fetch_refusal(info: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> str:
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return info.value.details() or ""


def test_a_job_past_its_retention_is_pruned_and_stays_refused(tmp_path: Path) -> None:
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    alice = dep.settings[0]
    jobs_dir = alice.state_dir / "jobs"
    clock = Clock()
    t0 = clock.now

    async def scenario() -> None:
        servers: list[PartyServer] = [await start_party_server(s) for s in dep.settings]
        channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
        cluster = ProcessCluster(dep)
        cluster.stubs = [Stub(c) for c in channels]
        try:
            servers[0].state.jobs.clock = clock  # Alice's clock
            _, _, shape = await cluster.upload(make_table(12, 3, seed=4), 1, "mask-1")
            await cluster.send_mask()
            box = [i.box_public_key for i in await identities(cluster.stubs)]
            recipient = dep.owners["recipient"].box

            async def run(job_id: str, mask_id: str) -> party_pb2.JobDescription:
                cluster.add_mask(box, shape, mask_id)
                await cluster.send_mask()
                desc = cluster.job(job_id, mask_id, Security.PASSIVE_3PC, "mpyc", 1,
                                   recipient)
                for stub in cluster.stubs:
                    await stub.StartJob(start_requests(desc))
                finals = await asyncio.gather(*(watch_to_end(s, job_id)
                                                for s in cluster.stubs))
                assert {f.state for f in finals} == {party_pb2.JOB_STATE_SUCCEEDED}
                return desc

            old = await run("job-old", "mask-old")  # ends at t0
            old_result = await fetch_opened(cluster.stubs, await identities(cluster.stubs),
                                            "job-old", recipient)
            clock.now = t0 + 20 * DAY
            await run("job-new", "mask-new")  # ends 20 days later
            # one not ended: its compile outlasts the test (Alice alone is sent it)
            servers[0].state.jobs.engines["mpyc"] = SlowEngine(  # type: ignore[assignment]
                MpycEngine(), 600.0)
            cluster.add_mask(box, shape, "mask-run")
            await cluster.send_mask()
            running = cluster.job("job-run", "mask-run", Security.PASSIVE_3PC, "mpyc", 1,
                                  recipient)
            await cluster.stubs[0].StartJob(start_requests(running))

            old_record = json.loads((jobs_dir / "job-old.json").read_text())
            assert (jobs_dir / "job-old" / "opened.u64").is_file()
            clock.now = t0 + (DEFAULT_JOB_RETENTION_DAYS + 1) * DAY  # a month on
            assert await servers[0].state.jobs.prune() == ["job-old"]
            assert await servers[0].state.jobs.prune() == []  # once

            # the old job's files are gone; its tombstone is what is left of it
            assert not (jobs_dir / "job-old").exists()
            assert not list(jobs_dir.glob(".pruned-*"))
            tomb = json.loads((jobs_dir / "job-old.json").read_text())
            kept = {k for k, v in tomb.items() if v not in ("", 0, 0.0, [], {})}
            assert TOMBSTONE_FIELDS - {"spent_consents", "failure"} <= kept
            assert not kept & {"description_hex", "verified", "shape"}
            for k in ("job_id", "description_sha256", "state", "mask_upload_id",
                      "spent_consents", "ended_at"):
                assert tomb[k] == old_record[k], k
            assert tomb["pruned_after_days"] == DEFAULT_JOB_RETENTION_DAYS
            # the recent job and the one not ended are kept whole
            assert (jobs_dir / "job-new" / "opened.u64").is_file()
            assert not servers[0].state.jobs.get("job-run").pruned
            assert json.loads((jobs_dir / "job-run.json").read_text())["description_hex"]
            got = await cluster.stubs[0].GetJob(party_pb2.GetJobRequest(job_id="job-run"))
            assert got.state == party_pb2.JOB_STATE_QUEUED

            # GetJob still tells how the pruned job ended
            got = await cluster.stubs[0].GetJob(party_pb2.GetJobRequest(job_id="job-old"))
            assert got.state == party_pb2.JOB_STATE_SUCCEEDED
            await check_pruned_job_refused(cluster, old)
            # the recent job's result is fetched as before, at every party
            parts = await fetch_opened(cluster.stubs, await identities(cluster.stubs),
                                       "job-new", recipient)
            assert all(np.array_equal(p, parts[0]) for p in parts)
            assert old_result[0].size == parts[0].size

            pruned = [e for e in servers[0].state.audit.entries()
                      if e["event"] == "job.pruned"]
            assert [e["job_id"] for e in pruned] == ["job-old"]
            assert pruned[0]["description_sha256"] == old_record["description_sha256"]
            assert pruned[0]["state"] == "succeeded"
            assert pruned[0]["retention_days"] == DEFAULT_JOB_RETENTION_DAYS
            await cluster.stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="job-run"))

            # a restart keeps the tombstone: the job stays refused, its result pruned
            await servers[0].stop(0)
            servers[0] = await start_party_server(alice)
            await channels[0].close()
            channels[0] = dep.channel(0, servers[0].port)
            cluster.stubs[0] = Stub(channels[0])
            assert json.loads((jobs_dir / "job-old.json").read_text()) == tomb
            await check_pruned_job_refused(cluster, old)
            assert (jobs_dir / "job-new" / "opened.u64").is_file()  # real clock: kept
        finally:
            for c in channels:
                await c.close()
            for srv in servers:
                await srv.stop(0)

    asyncio.run(scenario())

    # a daemon that starts past the recent job's retention prunes it before it answers
    state = open_state(alice)
    state.jobs.clock = lambda: t0 + 62 * DAY  # 31 days after job-run ended

    async def restart() -> None:
        srv = await start_party_server(alice, state)
        try:
            assert not (jobs_dir / "job-new").exists()
            assert json.loads((jobs_dir / "job-new.json").read_text())["pruned_at"]
            assert sorted(e["job_id"] for e in state.audit.entries()
                          if e["event"] == "job.pruned") == ["job-new", "job-old", "job-run"]
        finally:
            await srv.stop(0)

    asyncio.run(restart())


async def check_pruned_job_refused(cluster: ProcessCluster,
                                   old: party_pb2.JobDescription) -> None:
    """At Alice: the pruned job's StartJob replayed, and a new job on its mask upload,
    are refused; a fetch of its result says it was pruned."""
    alice = cluster.stubs[0]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await alice.StartJob(start_requests(old))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ran on Alice already" in (info.value.details() or "")
    again = cluster.job("job-again", "mask-old", Security.PASSIVE_3PC, "mpyc", 1,
                        cluster.dep.owners["recipient"].box)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await alice.StartJob(start_requests(again))
    assert "the mask upload was used by another job" in (info.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await alice.FetchResultPart(party_pb2.FetchResultPartRequest(job_id="job-old"))
    assert (f"the result of job 'job-old' was pruned after {DEFAULT_JOB_RETENTION_DAYS:g} "
            "days at Alice") in _fetch_refusal(info)


def test_the_retention_setting_and_flag(tmp_path: Path) -> None:
    from ppfs_cli.main import build_parser
    from ppfs_party.commands import _settings

    base = ["party", "serve", "--state-dir", str(tmp_path), "--index", "0"]
    parse = build_parser("party").parse_args
    assert _settings(parse(base)).job_retention_days == DEFAULT_JOB_RETENTION_DAYS == 30
    got = _settings(parse([*base, "--job-retention-days", "7.5"]))
    assert got.job_retention_days == 7.5 and got.job_retention == 7.5 * DAY
    for bad in (0.0, -1.0, 0.01, 4000.0, math.nan, math.inf):
        with pytest.raises(ParameterError, match="job_retention_days"):
            PartySettings(state_dir=tmp_path, index=0, job_retention_days=bad)
    assert replace(got, job_retention_days=1 / 24).job_retention == 3600


def test_a_prune_cut_short_is_finished_at_the_next_start(tmp_path: Path) -> None:
    """A crash after the tombstone is written and before the directory is gone: the
    next start deletes the directory (and any half-deleted copy of it)."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    jobs_dir = dep.settings[0].state_dir / "jobs"
    ended = "2026-01-01T00:00:00.000+00:00"
    record = {"job_id": "job-x", "description_hex": "", "description_sha256": "ab" * 32,
              "engine": "mpyc", "security": "passive-3pc", "state": "succeeded",
              "mask_upload_id": "mask-x", "ended_at": ended, "created_at": ended,
              "updated_at": ended, "pruned_at": "2026-02-01T00:00:00.000+00:00",
              "pruned_after_days": 30.0}
    (jobs_dir / "job-x.json").write_text(json.dumps(record))
    (jobs_dir / "job-x" / "engine").mkdir(parents=True)
    (jobs_dir / "job-x" / "opened.u64").write_bytes(b"\0" * 8)
    (jobs_dir / ".pruned-0123").mkdir()
    (jobs_dir / ".pruned-0123" / "opened.u64").write_bytes(b"\0" * 8)
    state = open_state(dep.settings[0])
    assert not (jobs_dir / "job-x").exists() and not (jobs_dir / ".pruned-0123").exists()
    assert state.jobs.get("job-x").pruned
    assert state.jobs.unfinished() == 0


def test_a_consent_a_pruned_job_spent_stays_spent(tmp_path: Path) -> None:
    """A consent for one job, spent by a job Alice then prunes: a second job under it
    is still refused, before and after a restart (the use is counted from the
    tombstone)."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    alice = dep.settings[0]
    clock = Clock()

    async def scenario() -> None:
        servers = [await start_party_server(s) for s in dep.settings]
        channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
        cluster = ProcessCluster(dep)
        cluster.stubs = [Stub(c) for c in channels]
        try:
            servers[0].state.jobs.clock = clock
            _, _, shape = await cluster.upload(make_table(12, 3, seed=4), 1, "mask-0")
            await cluster.send_mask()
            box = [i.box_public_key for i in await identities(cluster.stubs)]
            cluster.add_mask(box, shape, "mask-1")
            await cluster.send_mask()
            recipient = dep.owners["recipient"]
            key = bytes(recipient.box.public_key)
            once = Consent("owner-a", "ds", "recipient", key, Reveal.SELECTION,
                           max_jobs=1).sign(cluster.owner.key)

            def job(job_id: str, mask_id: str) -> party_pb2.JobDescription:
                return describe_job(job_id, [[cluster.data_up]], mask=cluster.masks[mask_id],
                                    k=1, security="passive-3pc", engine="mpyc",
                                    recipient_public_key=key, peers=dep.peer_addresses(),
                                    consents=[once])

            alice_stub = cluster.stubs[0]
            await alice_stub.StartJob(start_requests(job("job-0", "mask-0")))
            await alice_stub.CancelJob(party_pb2.CancelJobRequest(job_id="job-0"))
            clock.now += (DEFAULT_JOB_RETENTION_DAYS + 1) * DAY
            assert await servers[0].state.jobs.prune() == ["job-0"]
            await refused(alice_stub, job("job-1", "mask-1"))
            await servers[0].stop(0)
            servers[0] = await start_party_server(alice)
            await channels[0].close()
            channels[0] = dep.channel(0, servers[0].port)
            await refused(Stub(channels[0]), job("job-2", "mask-1"))
        finally:
            for c in channels:
                await c.close()
            for srv in servers:
                await srv.stop(0)

    async def refused(stub: Stub, desc: party_pb2.JobDescription) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.StartJob(start_requests(desc))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "(its consent allows 1 job, all used)" in (info.value.details() or "")

    asyncio.run(scenario())
