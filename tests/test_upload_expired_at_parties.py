"""A commit that reaches the parties after their staged parts expired, through the real
gateway and real party daemons (mutual TLS, port 0): the gateway recorded the upload
and its commit, then was away longer than the parties keep a part undecided (here the
parties' expiry is run, with a clock a few days on, right after the gateway recorded
the commit). Every party refuses the commit; the upload ends as not added, the owner
is told which parties expired it, no party holds it committed and no decision is left
pending."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ppfs_client.sdk import ApiError, UploadNotConfirmed, build_upload
from service_fakes import (
    Stack,
    owner_table,
    pending_decisions,
    wait_until,
)

from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")

DAY = 86_400.0


# the `stack` fixture (conftest.py): the real party daemons, in this process
PARTY_DAEMONS = True


def test_commit_after_every_party_expired_the_part_adds_nothing(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppfs_gateway.registry import Registry

    s = stack
    t = make_table(20, 3, seed=4)
    a = s.client("owner-a")
    ds = a.create_dataset("study")["id"]
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 12)), ds)
    first = a.get_dataset(ds)["upload_ids"]
    exps = a.get_dataset(ds)["column_exponents"]
    stores = [srv.state.store for srv in s.cluster.servers]

    real_commit = Registry.commit_upload

    def commit_then_away(self: Registry, *args: object, **kwargs: object) -> None:
        real_commit(self, *args, **kwargs)  # type: ignore[arg-type]
        # the gateway is away past the parties' expiry before it sends the commit
        for st in stores:
            s.loop.run(st.expire_staged(time.time() + 2 * DAY))

    monkeypatch.setattr(Registry, "commit_upload", commit_then_away)
    body = build_upload(s.keys["owner-a"], owner_table(t, slice(12, 20)), ds, a.deployment(),
                        exponents=exps)
    late = body["upload_id"]
    with pytest.raises(ApiError) as err:
        a.post_upload(ds, body)
    monkeypatch.undo()
    detail = err.value.detail
    assert err.value.status == 422, err.value
    assert all(name in detail for name in ("Alice", "Bob", "Carol")), detail
    assert "staged part expired" in detail and "not added" in detail, detail

    assert a.get_dataset(ds)["rows"] == 12
    assert a.get_dataset(ds)["upload_ids"] == first
    for st in stores:
        assert st.status(late) == "aborted"
        assert [u.manifest.upload_id for u in st.held_uploads(ds)] == first
        assert not any(st.staged_dir.iterdir())
    wait_until(lambda: pending_decisions(s) == [])
    check = a.check_dataset(ds)
    assert check["consistent"], check

    # the owner sends the rows again, under a new id: added once
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(12, 20)), ds, exponents=exps)
    assert a.get_dataset(ds)["rows"] == 20
    assert a.check_dataset(ds)["consistent"]


def test_a_party_that_expired_a_part_the_others_committed_is_repaired_by_its_owner(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Carol is cut off for longer than her expiry while Alice and Bob commit: she
    expired the part, undecided, and refuses the commit. The upload stands (committed
    elsewhere); `datasets check` names Carol; the owner's repair, signed by the owner,
    stores the part at Carol again and the data set is whole."""
    from ppfs_gateway.registry import Registry

    s = stack
    t = make_table(20, 3, seed=5)
    a = s.client("owner-a")
    ds = a.create_dataset("study")["id"]
    stores = [srv.state.store for srv in s.cluster.servers]
    real_commit = Registry.commit_upload

    def commit_while_carol_is_away(self: Registry, *args: object, **kwargs: object) -> None:
        real_commit(self, *args, **kwargs)  # type: ignore[arg-type]
        s.loop.run(stores[2].expire_staged(time.time() + 2 * DAY))

    monkeypatch.setattr(Registry, "commit_upload", commit_while_carol_is_away)
    # the owner is told at once: Carol's own signed statement does not list it
    with pytest.raises(UploadNotConfirmed, match=r"Carol did not confirm it holds it: its "
                       r"signed statement does not list upload .* datasets repair"):
        a.upload_table(s.keys["owner-a"], owner_table(t), ds)
    monkeypatch.undo()
    (uid,) = a.get_dataset(ds)["upload_ids"]
    assert a.get_dataset(ds)["rows"] == 20  # it stands: Alice and Bob committed it
    assert [st.status(uid) for st in stores] == ["committed", "committed", "aborted"]
    check = a.check_dataset(ds)
    assert not check["consistent"]
    assert {p["name"]: p["missing"] for p in check["parties"]}["Carol"] == [uid]

    # the gateway alone cannot bring it back: the original part, without the owner's
    # repair, is refused by Carol
    from ppfs_client.sent import load_sent

    sent = load_sent(s.keys["owner-a"], uid)
    with pytest.raises(ApiError) as err:
        a._call("POST", f"/v1/datasets/{ds}/uploads/{uid}/repair", {
            "party": 2, "manifest": sent["manifest"],
            "manifest_signature": sent["manifest_signature"], "part": sent["parts"][2]})
    assert "expired here undecided" in err.value.detail, err.value
    assert stores[2].status(uid) == "aborted"

    assert a.repair_dataset(s.keys["owner-a"], ds) == [(uid, "Carol")]
    assert [st.status(uid) for st in stores] == ["committed"] * 3
    assert a.check_dataset(ds)["consistent"]
    wait_until(lambda: pending_decisions(s) == [])


def test_the_registry_drops_an_expired_upload_only_while_no_party_committed_it(
    tmp_path: Path,
) -> None:
    from ppfs_gateway.registry import DatasetSchema, Registry

    schema = DatasetSchema(("a",), (0,), "y", ("no", "yes"), 16, "rep3")
    reg = Registry(tmp_path / "registry.db")
    reg.create_dataset("ds", "d", "owner-a", "data")
    for uid, rows in (("u-1", 3), ("u-2", 4)):
        reg.stage_upload("ds", uid, 3)
        reg.commit_upload("ds", uid, "owner-a", schema, rows, uid * 16,
                          "2025-01-01T00:00:00.000000Z")
    refusal = "Carol refused CommitUpload: ... its staged part expired ..."

    # u-1: Bob acknowledged the commit before Carol refused it: it stands
    reg.decision_done("u-1", 1, decision="commit")
    assert not reg.drop_expired_upload("u-1", {2: refusal})
    got = reg.get_dataset("ds")
    assert got is not None and got.upload_ids == ("u-1", "u-2") and got.rows == 7

    # u-2: nobody acknowledged it: out of the data set, to be aborted at every party
    assert reg.drop_expired_upload("u-2", {2: refusal})
    got = reg.get_dataset("ds")
    assert got is not None and got.upload_ids == ("u-1",) and got.rows == 3
    assert [(d.party, d.decision, d.error) for d in reg.decisions(upload_id="u-2")] == [
        (0, "abort", ""), (1, "abort", ""), (2, "abort", refusal)]
    # an acknowledgement of the commit sent before the drop does not count as the abort's
    reg.decision_done("u-2", 0, decision="commit")
    assert [d.party for d in reg.decisions(pending=True, upload_id="u-2")] == [0, 1, 2]
    reg.decision_done("u-2", 0, decision="abort")
    assert [d.party for d in reg.decisions(pending=True, upload_id="u-2")] == [1, 2]
    assert reg.drop_expired_upload("u-2", {1: refusal})  # again: nothing more to drop
    assert reg.get_dataset("ds").rows == 3  # type: ignore[union-attr]
    assert reg.upload_exists("u-2")  # the id stays used
    reg.close()
