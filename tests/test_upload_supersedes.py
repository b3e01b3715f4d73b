"""An owner sends rows again after an upload it was never told was added: the new upload
replaces the earlier one (``Manifest.supersedes``), and every party enforces that at most
one of them is ever used, whatever the gateway answered about the earlier one.

Real party daemons (in this process, over gRPC) and the real gateway; the gateway's
answers are turned where the client reads them (ppfs_client.sdk.GatewayClient)."""

from __future__ import annotations

from pathlib import Path
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



def _replacing(up: Any, owner: Any, supersedes: tuple[str, ...]) -> Any:
    """``up`` re-signed by ``owner`` with a manifest that replaces ``supersedes``."""
    from dataclasses import replace

    from ppfs.upload import Manifest, sign_manifest

    m = replace(Manifest.from_bytes(up.manifest), supersedes=supersedes)
    return replace(up, manifest=m.to_bytes(), signature=sign_manifest(m, owner.key))


def test_an_owner_cannot_end_another_owners_expired_part_by_naming_it_replaced(
    tmp_path: Path,
) -> None:
    """owner-b's part expired undecided at this party (committed at the others, waiting
    for owner-b's repair). owner-a, who saw its id, names it in the ``supersedes`` of an
    upload of its own: refused, and owner-b's part stays expired, not ended for good, so
    owner-b's repair still brings it back. The same owner replacing its own expired part
    still ends it for good."""
    import asyncio

    from nacl.signing import SigningKey
    from party_harness import Owner, StoreParty, data_upload, put_part
    from ppfs_party.store import register_owner

    from ppfs.upload import UploadRejected

    party = StoreParty.create(tmp_path, seed=5, now=1_800_000_000.0)
    b = Owner("owner-b", SigningKey.generate())
    register_owner(party.state, b.owner_id, bytes(b.key.verify_key))
    boxes = [bytes(party.box.public_key), *party.others]

    def of(owner: Owner, upload_id: str) -> Any:
        import numpy as np

        raw = np.random.default_rng(7).integers(-1000, 1000, size=(6, 3))  # test data
        return data_upload(owner, boxes, raw, ["a", "b", "c"], [0, 0, 0], dataset_id="ds",
                           upload_id=upload_id, onehot=(np.arange(6) % 2).reshape(6, 1),
                           label_column="y", classes=("0", "1"))

    async def scenario() -> None:
        store = party.store()
        await put_part(store, of(b, "u-b"))
        await put_part(store, of(party.owner, "u-a-first"))
        party.now = 1_800_000_000.0 + 30 * 24 * 3600.0
        assert sorted(await store.expire_staged()) == ["u-a-first", "u-b"]
        with pytest.raises(UploadRejected, match="u-b"):
            await put_part(store, _replacing(of(party.owner, "u-a"), party.owner, ("u-b",)))
        assert store.status("u-a") == "absent"
        assert store._expired_here("u-b"), "another owner's expired part was ended for good"
        # its own expired part: ended for good, the retry taken
        await put_part(store, _replacing(of(party.owner, "u-a2"), party.owner,
                                         ("u-a-first",)))
        assert store.status("u-a2") == "staged" and not store._expired_here("u-a-first")

    asyncio.run(scenario())


def test_ids_an_upload_replaces_count_against_the_partys_tombstone_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every id an upload replaces that this party never received becomes a tombstone,
    kept for ever: like an abort of a part it never received, refused once the party
    keeps its limit of them (an owner's uploads, 16 ids each, would else grow them
    without end), and nothing of the upload is kept."""
    import asyncio

    from party_harness import StoreParty, put_part
    from ppfs_party import store as store_mod

    from ppfs.upload import UploadRejected

    monkeypatch.setattr(store_mod, "MAX_TOMBSTONES", 3)
    party = StoreParty.create(tmp_path, seed=6)

    async def scenario() -> None:
        store = party.store()
        await put_part(store, _replacing(party.sealed("u-1"), party.owner, ("x-1", "x-2")))
        assert [store.status(u) for u in ("x-1", "x-2", "u-1")] == [
            "aborted", "aborted", "staged"]
        with pytest.raises(UploadRejected, match="at most 3 aborted upload ids"):
            await put_part(store, _replacing(party.sealed("u-2"), party.owner,
                                             ("x-3", "x-4")))
        assert [store.status(u) for u in ("x-3", "x-4", "u-2")] == ["absent"] * 3
        # ids already refused here add no tombstone: taken
        await put_part(store, _replacing(party.sealed("u-3"), party.owner, ("x-1",)))
        assert store.status("u-3") == "staged"

    asyncio.run(scenario())
