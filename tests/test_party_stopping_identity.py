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
from party_harness import SlowEngine, identities, parties_running_a_long_job, start_requests
from ppfs_party import state as party_state

from ppfs.engines.base import Engine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.v1 import party_pb2


def test_a_stopping_party_says_so_and_still_refuses_new_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def usable(settings: Any) -> dict[str, Engine]:  # a compile that outlasts every wait
        return {"mpyc": SlowEngine(MpycEngine(), 30.0)}  # type: ignore[dict-item]

    monkeypatch.setattr(party_state, "usable_engines", usable)

    async def main() -> None:
        now = asyncio.Event()
        async with parties_running_a_long_job(tmp_path) as parties:
            try:
                stubs = parties.cluster.stubs
                assert not any(i.stopping or i.stop_seconds_left for i in await identities(stubs))
                drain = asyncio.create_task(parties.servers[0].drain(60.0, now))
                await asyncio.sleep(0.3)
                alice, bob, carol = await identities(stubs)
                assert alice.stopping and 50 <= alice.stop_seconds_left <= 60, alice
                assert not bob.stopping and not carol.stopping
                # the party refuses a new job itself, as before
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stubs[0].StartJob(start_requests(parties.late))
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "Alice is stopping" in (info.value.details() or "")
                now.set()  # a second stop: the drain ends at once
                assert await asyncio.wait_for(drain, 10) is None
                ident = await stubs[0].GetIdentity(party_pb2.GetIdentityRequest())
                assert ident.stopping and ident.stop_seconds_left == 0
            finally:
                now.set()

    asyncio.run(main())
