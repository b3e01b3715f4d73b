"""`datasets check` has every party read all of a data set's share files: the gateway
gives each party the time to read them (at VERIFY_BYTES_PER_SECOND, on top of an instant
answer), so that a large data set on a slow disk is not reported as a frozen party,
while a listing that reads nothing keeps the instant answer's deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ppfs_gateway.uploads as gateway_uploads
import pytest
from service_fakes import FakeParty, make_stack, owner_table

from ppfs.synthetic import make_table


def test_verifying_a_data_set_gets_time_to_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[bool, float]] = []
    listing = FakeParty.ListUploads

    async def recording(self: FakeParty, request: Any, context: Any) -> Any:
        seen.append((request.verify, context.time_remaining()))
        return await listing(self, request, context)

    monkeypatch.setattr(FakeParty, "ListUploads", recording)
    # 400 rows x (3 columns + 2 classes) x 24 bytes: 47 s at 1 KiB/s
    monkeypatch.setattr(gateway_uploads, "VERIFY_BYTES_PER_SECOND", 1024)
    s = make_stack(tmp_path)
    try:
        keys, client = s.keys["owner-a"], s.client("owner-a")
        ds = client.new_dataset(keys, "large")["id"]
        client.upload_table(keys, owner_table(make_table(400, 3, seed=3)), ds)
        seen.clear()
        assert client.check_dataset(ds)["consistent"]
    finally:
        s.close()
    verifying = [t for v, t in seen if v]
    assert len(verifying) == 3, seen  # one listing per party, each reading its files
    assert all(t > 40 for t in verifying), verifying
    assert all(t < 15 for v, t in seen if not v), seen
