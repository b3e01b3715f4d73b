"""A party that was told to stop says so in its identity (GetIdentity: ``stopping`` and
how long its unfinished jobs have left), so that the gateway can refuse new jobs up
front; it still refuses StartJob itself, whatever the gateway does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from party_harness import Deployment, ProcessCluster, SlowEngine, identities, start_requests
from ppfs_party import state as party_state
from ppfs_party.server import start_party_server

from ppfs.engines.base import Engine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.step2a import Security
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2, party_pb2_grpc


def test_a_stopping_party_says_so_and_still_refuses_new_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def usable(settings: Any) -> dict[str, Engine]:  # a compile that outlasts every wait
        return {"mpyc": SlowEngine(MpycEngine(), 30.0)}  # type: ignore[dict-item]

    monkeypatch.setattr(party_state, "usable_engines", usable)

    async def main() -> None:
        dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
        servers = [await start_party_server(s) for s in dep.settings]
        channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
        cluster = ProcessCluster(dep)
        cluster.stubs = [party_pb2_grpc.PartyServiceStub(c) for c in channels]
        now = asyncio.Event()
        try:
            assert not any(i.stopping or i.stop_seconds_left
                           for i in await identities(cluster.stubs))
            table = make_table(12, 3, seed=4)
            _, _, shape = await cluster.upload(table, 1, "mask-1")
            await cluster.send_mask()
            rec = dep.owners["recipient"].box
            desc = cluster.job("job-long", "mask-1", Security.PASSIVE_3PC, "mpyc", 1, rec)
            for stub in cluster.stubs:
                await stub.StartJob(start_requests(desc))
            cluster.add_mask([i.box_public_key for i in await identities(cluster.stubs)],
                             shape, "mask-2")
            await cluster.send_mask()
            drain = asyncio.create_task(servers[0].drain(60.0, now))
            await asyncio.sleep(0.3)
            alice, bob, carol = await identities(cluster.stubs)
            assert alice.stopping and 50 <= alice.stop_seconds_left <= 60, alice
            assert not bob.stopping and not carol.stopping
            # the party refuses a new job itself, as before
            late = cluster.job("job-late", "mask-2", Security.PASSIVE_3PC, "mpyc", 1, rec)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await cluster.stubs[0].StartJob(start_requests(late))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "Alice is stopping" in (info.value.details() or "")
            now.set()  # a second stop: the drain ends at once
            assert await asyncio.wait_for(drain, 10) is None
            ident = await cluster.stubs[0].GetIdentity(party_pb2.GetIdentityRequest())
            assert ident.stopping and ident.stop_seconds_left == 0
        finally:
            now.set()
            for c in channels:
                await c.close()
            for srv in servers:
                await srv.stop(0)

    asyncio.run(main())
