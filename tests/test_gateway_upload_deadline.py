"""A party that stops answering while an upload part is sent to it is named within the
time that part needs, not after the full transfer deadline: the gateway waits
``party_rpc_seconds`` plus one second per UPLOAD_FLOOR_BYTES_PER_SECOND of the part,
at most ``party_transfer_seconds``. A small part (an analyst's output mask, a few rows)
is thus refused within seconds, naming the party, and the upload is not added."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from ppfs_client.sdk import ApiError
from ppfs_gateway.parties import UPLOAD_FLOOR_BYTES_PER_SECOND, upload_part_seconds
from service_fakes import FakeCluster, FakeParty, make_stack, owner_table

from ppfs.synthetic import make_table

RPC = 5.0
TRANSFER = 120.0


def test_a_small_part_gets_about_an_instant_answers_time() -> None:
    assert upload_part_seconds(0, RPC, TRANSFER) == RPC
    assert upload_part_seconds(4096, RPC, TRANSFER) == RPC + 1
    assert upload_part_seconds(UPLOAD_FLOOR_BYTES_PER_SECOND, RPC, TRANSFER) == RPC + 1


def test_a_larger_part_gets_a_second_per_floor_rate_of_bytes() -> None:
    rate = UPLOAD_FLOOR_BYTES_PER_SECOND
    assert upload_part_seconds(10 * rate, RPC, TRANSFER) == RPC + 10
    assert upload_part_seconds(10 * rate + 1, RPC, TRANSFER) == RPC + 11
    small, large = (upload_part_seconds(n << 20, RPC, TRANSFER) for n in (1, 8))
    assert RPC < small < large < TRANSFER


def test_a_huge_part_is_capped_at_the_transfer_deadline() -> None:
    assert upload_part_seconds(1 << 30, RPC, TRANSFER) == TRANSFER
    assert upload_part_seconds(256 << 20, RPC, TRANSFER) == TRANSFER
    # a transfer deadline set below the instant answer's is kept
    assert upload_part_seconds(4096, RPC, 2.0) == 2.0


class SilentOnUpload(FakeParty):
    """A party that takes an upload part's bytes and then never answers (it froze)."""

    async def PutUploadPart(self, request_iterator: Any, context: Any) -> Any:
        async for _ in request_iterator:
            pass
        await asyncio.Event().wait()


def test_a_party_silent_on_a_small_part_is_named_within_its_deadline(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster(3, tmp_path)
    cluster.parties[1] = SilentOnUpload(cluster, 1)
    s = make_stack(tmp_path, cluster=cluster, party_rpc_seconds=RPC,
                   party_transfer_seconds=TRANSFER)
    try:
        keys, client = s.keys["owner-a"], s.client("owner-a")
        ds = client.new_dataset(keys, "small")["id"]
        t0 = time.monotonic()
        with pytest.raises(ApiError) as err:
            client.upload_table(keys, owner_table(make_table(20, 3, seed=3)), ds)
        took = time.monotonic() - t0
        # a few kB: the instant answer's 5 s and one second for the bytes
        assert (f"Bob did not answer the upload within {RPC + 1:g} s (frozen or "
                "overloaded?)") in err.value.detail, err.value.detail
        assert "the upload was not added" in err.value.detail, err.value.detail
        assert took < RPC + 10, f"the upload took {took:.0f} s"
        assert client.get_dataset(ds)["rows"] == 0
        for i in (0, 2):  # the parties that stored their part dropped it
            assert not cluster.parties[i].uploads, i
    finally:
        s.close()
