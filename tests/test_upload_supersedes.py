"""An owner sends rows again after an upload it was never told was added: the new upload
replaces the earlier one (``Manifest.supersedes``), and every party enforces that at most
one of them is ever used, whatever the gateway answered about the earlier one.

Real party daemons (in this process, over gRPC) and the real gateway; the gateway's
answers are turned where the client reads them (ppfs_client.sdk.GatewayClient)."""

from __future__ import annotations

from typing import Any

import pytest
from ppfs_client.sdk import ApiError, GatewayClient
from service_fakes import Stack, owner_table

from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


# the `stack` fixture (conftest.py): the real party daemons, in this process
PARTY_DAEMONS = True


def _status(s: Stack, upload_id: str) -> list[str]:
    return [srv.state.store.status(upload_id) for srv in s.cluster.servers]


def test_a_gateway_that_hides_an_added_upload_cannot_have_its_rows_counted_twice(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stack
    keys, a = s.keys["owner-a"], s.client("owner-a")
    t = make_table(12, 3, seed=31)
    ds = a.new_dataset(keys, "hidden")["id"]
    a.upload_table(keys, owner_table(t), ds)
    (first,) = a.get_dataset(ds)["upload_ids"]
    check = GatewayClient.check_dataset

    def hidden(self: GatewayClient, dataset_id: str) -> dict[str, Any]:
        got = check(self, dataset_id)  # the gateway says it neither added nor holds it
        got["recorded"] = []
        for p in got["parties"]:
            p["held"] = []
        return got

    monkeypatch.setattr(GatewayClient, "check_dataset", hidden)
    with pytest.raises(ApiError) as info:  # sent again: it replaces the first one
        a.upload_table(keys, owner_table(t), ds)
    assert f"replaces upload '{first}', which this party holds: the same rows would count " \
           "twice" in str(info.value), info.value
    monkeypatch.undo()
    assert a.get_dataset(ds)["rows"] == 12 and a.get_dataset(ds)["upload_ids"] == [first]
    assert _status(s, first) == ["committed"] * 3


def test_an_upload_replaced_by_a_retry_is_refused_when_the_gateway_sends_it_later(
    stack: Stack,
) -> None:
    s = stack
    keys, a = s.keys["owner-a"], s.client("owner-a")
    t = make_table(12, 3, seed=32)
    ds = a.new_dataset(keys, "kept back")["id"]
    kept: dict[str, Any] = {}
    cut = s.client("owner-a")

    def kept_back(dataset_id: str, body: dict[str, Any], progress: Any = None) -> Any:
        kept.update(body)  # the gateway keeps the body and answers nothing
        raise ApiError(0, "gateway unreachable", "the connection was cut")

    cut.post_upload = kept_back  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        cut.upload_table(keys, owner_table(t), ds)
    old = kept["upload_id"]
    a.upload_table(keys, owner_table(t), ds)  # not added, not held: sent again
    (new,) = a.get_dataset(ds)["upload_ids"]
    (man,) = [u.manifest for u, _ in s.cluster.servers[0].state.store.listing(ds)]
    assert man.upload_id == new and man.supersedes == (old,)
    assert _status(s, old) == ["aborted"] * 3
    with pytest.raises(ApiError) as info:  # the gateway sends the first one now
        a.post_upload(ds, kept)
    assert "this upload was aborted (its id is refused)" in str(info.value), info.value
    assert a.get_dataset(ds)["rows"] == 12 and a.get_dataset(ds)["upload_ids"] == [new]

