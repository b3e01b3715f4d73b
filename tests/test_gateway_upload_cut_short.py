"""A party that refuses an upload part while the gateway is still writing it closes the
call early; gRPC's asyncio client then reports its own status for the cut-off write
("Internal error from Core") instead of the party's. The gateway names that as the
party's refusal, not as a failure of the party's own (a disk, a crash)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc import aio
from ppfs_gateway.errors import PartyFailed, PartyRejected
from ppfs_gateway.parties import LOST_STATUS, PartyClient

from ppfs.v1 import party_pb2 as pb


class _Stub:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details

    async def PutUploadPart(self, chunks: Any, timeout: float) -> pb.PutUploadPartResponse:
        async for _ in chunks:  # the header is written, then the call ends
            break
        raise aio.AioRpcError(self.code, aio.Metadata(), aio.Metadata(), self.details)


def _put(code: grpc.StatusCode, details: str) -> None:
    c = PartyClient(index=1, endpoint=None, channel=None,  # type: ignore[arg-type]
                    stub=_Stub(code, details), rpc_seconds=5.0)  # type: ignore[arg-type]
    header = pb.UploadPartHeader(dataset_id="ds", upload_id="u1")
    asyncio.run(c.put_upload_part(header, b"\0" * (3 << 20)))


def test_a_write_cut_short_by_the_party_is_its_refusal() -> None:
    with pytest.raises(PartyRejected, match=r"Bob refused the upload before all of it was"):
        _put(grpc.StatusCode.INTERNAL, LOST_STATUS)


def test_a_party_naming_its_own_failure_is_still_a_failure() -> None:
    with pytest.raises(PartyFailed, match=r"Bob failed the upload: this party's disk is full"):
        _put(grpc.StatusCode.INTERNAL, "this party's disk is full (no space left on device)")
