"""A data owner withdraws its data through the service: real party daemons (gRPC, mutual
TLS), the real gateway and the client. Each party deletes the owner's uploads on the
owner's signature and says so in a receipt signed by its own key; the client confirms a
party only by that receipt, so a gateway that does not relay the withdrawal, or forges
or swaps a receipt, is caught and the party named."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey
from ppfs_client.sdk import ApiError
from ppfs_gateway.errors import PartyUnavailable
from ppfs_gateway.parties import PartyClient
from service_fakes import Stack, owner_table, run_cli, wait_final

from ppfs.contract import Reveal
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2 as pb
from ppfs.withdrawal import Withdrawal, WithdrawalReceipt

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


# the `stack` fixture (conftest.py): the real party daemons, in this process
PARTY_DAEMONS = True


def _shared(s: Stack) -> tuple[str, list[str], list[str]]:
    """One data set: two uploads of owner-a, then one of owner-b; consents to the
    analyst. (data set id, owner-a's upload ids, owner-b's)."""
    t = make_table(40, 3, seed=8)
    a, b, admin = s.client("owner-a"), s.client("owner-b"), s.client("admin")
    ds = a.create_dataset("shared")["id"]
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 12)), ds)
    exps = a.get_dataset(ds)["column_exponents"]
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(12, 20)), ds, exponents=exps)
    admin.grant(ds, "owner-b")
    b.upload_table(s.keys["owner-b"], owner_table(t, slice(20, 40)), ds, exponents=exps)
    admin.grant(ds, "analyst-1")
    for owner in ("owner-a", "owner-b"):
        s.client(owner).consent(s.keys[owner], ds, "analyst-1",
                                s.keys["analyst-1"].box_public_key, Reveal.SELECTION)
    ids = s.client("owner-a").get_dataset(ds)["upload_ids"]
    owners = {u["upload_id"]: u["owner_id"] for u in a.check_dataset(ds)["recorded"]}
    return (ds, [u for u in ids if owners[u] == "owner-a"],
            [u for u in ids if owners[u] == "owner-b"])


def _held_at(s: Stack, party: int, ds: str) -> list[str]:
    store = s.cluster.servers[party].state.store
    return [u.manifest.upload_id for u in store.held_uploads(ds)]


def _on_disk(s: Stack, party: int, upload_id: str) -> bool:
    state = s.cluster.dep.settings[party].state_dir
    return any((state / where / upload_id).exists() for where in ("uploads", "staged"))


def test_an_owner_withdraws_its_data_and_every_party_confirms(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    ds, mine, theirs = _shared(s)
    assert len(mine) == 2 and len(theirs) == 1

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "withdraw", ds)
    assert rc == 0, out + err
    for name in ("Alice", "Bob", "Carol"):
        assert f"{name}: confirmed by its signed receipt (deleted 2 upload(s) now)" in err, err
    assert f"withdrew your uploads of {ds} at 3 of 3 parties" in out
    for i in range(3):  # gone from every party, disk included; owner-b's rows stay
        assert _held_at(s, i, ds) == theirs
        assert not any(_on_disk(s, i, u) for u in mine)
    d = s.client("owner-b").get_dataset(ds)
    assert d["upload_ids"] == theirs and d["rows"] == 20
    assert s.client("owner-a").check_dataset(ds)["consistent"]

    # a job on the data set now runs on owner-b's rows alone
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], [ds], label="label", k=1,
                         security="passive-3pc", engine="mpyc")
    done = wait_final(analyst, job["id"], timeout=120)
    assert done["state"] == "succeeded" and done["m"] == 20, done

    # asked again: every party confirms, nothing more to delete
    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "withdraw", ds)
    assert rc == 0 and err.count("nothing left to delete") == 3, err
    # and owner-a's repair cannot bring a withdrawn upload back
    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "repair", ds)
    assert "nothing of yours to repair" in err, err
    assert all(_held_at(s, i, ds) == theirs for i in range(3))


def test_a_party_not_reached_is_named_and_a_second_withdrawal_reaches_it(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    ds, mine, theirs = _shared(s)
    carol = s.cluster.servers[2]
    port = int(carol.port)
    s.loop.run(carol.stop(0))

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "withdraw", ds)
    assert rc == 1, out + err
    assert "Carol: NOT confirmed" in err and "Alice: confirmed" in err, err
    assert "Carol may still hold your uploads" in err and f"datasets withdraw {ds}" in err
    assert all(_on_disk(s, 2, u) for u in mine)  # Carol was down: her copies remain
    # the gateway's record no longer offers them to any job
    assert s.client("owner-a").get_dataset(ds)["upload_ids"] == theirs

    from ppfs_party.server import start_party_server

    settings = replace(s.cluster.dep.settings[2], listen=f"127.0.0.1:{port}")
    s.cluster.servers[2] = s.loop.run(start_party_server(settings))
    deadline = time.monotonic() + 30  # the gateway reconnects (gRPC backs off a while)
    while not s.client("owner-a").check_dataset(ds)["parties"][2]["reachable"]:
        assert time.monotonic() < deadline, "the gateway never reached Carol again"
        time.sleep(0.2)
    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "withdraw", ds)
    assert rc == 0, out + err
    assert "Carol: confirmed by its signed receipt (deleted 2 upload(s) now)" in err, err
    assert "Alice: confirmed by its signed receipt (nothing left to delete)" in err, err
    assert not any(_on_disk(s, 2, u) for u in mine)
    assert _held_at(s, 2, ds) == theirs


def test_a_gateway_that_forges_swaps_or_replays_a_receipt_is_caught(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stack
    ds, mine, _ = _shared(s)
    relay = PartyClient.withdraw
    # an earlier, genuine withdrawal of another data set: the gateway keeps Carol's receipt
    a = s.client("owner-a")
    other = a.create_dataset("other")["id"]
    a.upload_table(s.keys["owner-a"], owner_table(make_table(10, 3, seed=2)), other)
    kept: dict[int, Any] = {}

    async def recording(self: PartyClient, statement: bytes, signature: bytes) -> Any:
        kept[self.index] = await relay(self, statement, signature)
        return kept[self.index]

    monkeypatch.setattr(PartyClient, "withdraw", recording)
    assert run_cli(capsys, s, "owner-a", "datasets", "withdraw", other)[0] == 0

    own_key = SigningKey.generate()  # the gateway's: not a party's certified key
    clients: dict[int, PartyClient] = {}

    def turned(how: str) -> Any:
        async def withdraw(self: PartyClient, statement: bytes, signature: bytes) -> Any:
            clients[self.index] = self  # the parties are asked in order: Alice first
            if self.index != 2:
                return await relay(self, statement, signature)
            # Carol never hears of it; the gateway answers in her name
            if how == "forged":
                w = Withdrawal.from_bytes(statement)
                blob, sig = WithdrawalReceipt(
                    hashlib.sha256(statement).hexdigest(), 2, w.owner_id, w.dataset_id, (),
                    0).sign(own_key)
                return pb.WithdrawUploadsResponse(receipt=blob, receipt_signature=sig)
            if how == "swapped":  # Alice's real receipt, as Carol's
                return await relay(clients[0], statement, signature)
            return kept[2]  # Carol's real receipt, of the earlier withdrawal
        return withdraw

    for how, why in (("forged", "Carol's receipt is not signed by Carol's certified key"),
                     ("swapped", "Carol's receipt is not signed by Carol's certified key"),
                     ("replayed", "Carol's receipt is for another withdrawal or party")):
        monkeypatch.setattr(PartyClient, "withdraw", turned(how))
        rc, _, err = run_cli(capsys, s, "owner-a", "datasets", "withdraw", ds)
        assert rc == 1 and f"Carol: NOT confirmed: {why}" in err, (how, err)
        assert "Alice: confirmed" in err and "Bob: confirmed" in err
        assert all(_on_disk(s, 2, u) for u in mine), how  # Carol still holds them


def test_the_gateway_relays_only_the_callers_own_withdrawal(stack: Stack) -> None:
    s = stack
    ds, mine, theirs = _shared(s)
    signed = Withdrawal.now("owner-a", ds).sign(s.keys["owner-a"].signing)
    body = {"statement": base64.b64encode(signed.statement).decode(),
            "signature": base64.b64encode(signed.signature).decode()}
    b = s.client("owner-b")
    with pytest.raises(ApiError) as info:  # owner-b relaying owner-a's statement
        b._call("POST", f"/v1/datasets/{ds}/withdraw", body)
    assert info.value.status == 403 and "made by the owner it names" in str(info.value)
    a = s.client("owner-a")
    other = a.create_dataset("elsewhere")["id"]
    with pytest.raises(ApiError) as info:  # the statement names another data set
        a._call("POST", f"/v1/datasets/{other}/withdraw", body)
    assert info.value.status == 422 and ds in str(info.value)
    with pytest.raises(ApiError) as info:
        a._call("POST", f"/v1/datasets/{ds}/withdraw",
                {"statement": base64.b64encode(b"{}").decode(), "signature": ""})
    assert info.value.status == 422 and "malformed" in str(info.value)
    for garbage in ({"statement": "A" * 100_000, "signature": ""},  # too long to read
                    {"statement": "not base64!", "signature": ""},
                    {"statement": "", "signature": "", "extra": 1}):
        with pytest.raises(ApiError) as info:
            a._call("POST", f"/v1/datasets/{ds}/withdraw", garbage)
        assert info.value.status == 422, info.value
    # the owner's token without the owner's key: every party refuses, nothing is removed
    stolen = Withdrawal.now("owner-a", ds).sign(SigningKey.generate())
    got = a._call("POST", f"/v1/datasets/{ds}/withdraw", {
        "statement": base64.b64encode(stolen.statement).decode(),
        "signature": base64.b64encode(stolen.signature).decode()})
    assert got["removed"] == [] and all(
        not p["receipt"] and "not signed by the key registered" in p["error"]
        for p in got["parties"]), got
    assert a.get_dataset(ds)["upload_ids"] == s.client("owner-b").get_dataset(ds)["upload_ids"]
    for i in range(3):  # nothing deleted at any party
        assert set(_held_at(s, i, ds)) == {*mine, *theirs}
    assert s.client("owner-a").get_dataset(ds)["rows"] == 40


def test_the_registry_drops_a_withdrawn_uploads_rows_and_pending_commits(
    tmp_path: Path,
) -> None:
    from ppfs_gateway.registry import DatasetSchema, Registry

    schema = DatasetSchema(("a",), (0,), "y", ("no", "yes"), 16, "rep3")
    reg = Registry(tmp_path / "registry.db")
    reg.create_dataset("ds", "d", "owner-a", "data")
    for uid, owner, rows, at in (("u-1", "owner-a", 3, "2025-01-01T00:00:00.000000Z"),
                                 ("u-2", "owner-b", 2, "2025-01-02T00:00:00.000000Z"),
                                 ("u-3", "owner-a", 4, "2025-01-03T00:00:00.000000Z"),
                                 ("u-4", "owner-a", 5, "2025-01-05T00:00:00.000000Z")):
        reg.stage_upload("ds", uid, 3)
        reg.commit_upload("ds", uid, owner, schema, rows, uid * 16, at)
    for p in range(3):  # every commit acknowledged but u-3's at Carol
        for uid in ("u-1", "u-2", "u-3", "u-4"):
            if (uid, p) != ("u-3", 2):
                reg.decision_done(uid, p)
    # owner-a's withdrawal signed on 4 January: u-1 and u-3, not its later u-4
    assert reg.withdraw_uploads("ds", "owner-a", "2025-01-04T00:00:00.000000Z") == [
        "u-1", "u-3"]
    got = reg.get_dataset("ds")
    assert got is not None and got.upload_ids == ("u-2", "u-4") and got.rows == 7
    assert reg.decisions(pending=True) == []  # u-3's commit is not sent to Carol any more
    assert reg.upload_exists("u-1") and reg.upload_exists("u-3")  # ids stay used
    assert reg.withdraw_uploads("ds", "owner-a", "2025-01-04T00:00:00.000000Z") == []
    reg.close()


def test_an_owner_revokes_its_consents_and_every_party_refuses_them(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stack
    ds, _, _ = _shared(s)
    from ppfs_gateway.registry import Registry

    path = s.root / "gateway" / "registry.sqlite3"
    reg = Registry(path)
    (kept,) = [c for c in reg.consents(ds) if c.owner_id == "owner-a"]
    reg.close()

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "revoke", ds,
                           "--recipient", "analyst-1")
    assert rc == 0, out + err
    assert err.count("confirmed by its signed receipt (no job relied on them)") == 3, err
    assert f"revoked your consents to analyst-1 on {ds} at 3 of 3 parties" in out
    assert [c["owner_id"] for c in s.client("owner-a").list_consents(ds)] == ["owner-b"]

    # a turned gateway that kept the consent and relays it anyway: every party refuses
    reg = Registry(path)
    reg.add_consent(kept)
    reg.close()
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], [ds], label="label", k=1,
                         security="passive-3pc", engine="mpyc")
    done = wait_final(analyst, job["id"], timeout=60)
    assert done["state"] == "failed", done
    assert "its owner revoked its consent" in done["error"], done["error"]

    # nor can it claim a party kept the revocation when it never relayed it
    relay = PartyClient.revoke_consents

    async def withheld(self: PartyClient, statement: bytes, signature: bytes) -> Any:
        if self.index == 1:
            raise PartyUnavailable("Bob did not answer RevokeConsents (unavailable)")
        return await relay(self, statement, signature)

    monkeypatch.setattr(PartyClient, "revoke_consents", withheld)
    rc, _, err = run_cli(capsys, s, "owner-b", "datasets", "revoke", ds,
                         "--recipient", "analyst-1")
    assert rc == 1 and "Bob: NOT confirmed: Bob did not answer" in err, err
    assert "Bob may still run jobs for analyst-1 on your consents" in err
    monkeypatch.setattr(PartyClient, "revoke_consents", relay)

    # owner-a consents again, in a later second: its consent counts again, owner-b's not
    time.sleep(1.05)
    s.client("owner-a").consent(s.keys["owner-a"], ds, "analyst-1",
                                s.keys["analyst-1"].box_public_key, Reveal.SELECTION)
    job = analyst.submit(s.keys["analyst-1"], [ds], label="label", k=1,
                         security="passive-3pc", engine="mpyc")
    done = wait_final(analyst, job["id"], timeout=60)
    assert done["state"] == "failed", done
    assert "from owner 'owner-b'" in done["error"] and "'owner-a'" not in done["error"], done


def test_a_party_frozen_on_a_withdrawal_is_named_within_its_deadline(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Carol accepts the call and never answers (frozen): the owner's command names her
    # after an instant answer's time plus WITHDRAW_EXTRA_SECONDS, not a transfer's time
    from ppfs_gateway import parties
    from ppfs_party.state import PartyState

    s = stack
    ds, mine, _ = _shared(s)
    monkeypatch.setattr(parties, "WITHDRAW_EXTRA_SECONDS", 1.0)
    carry_out = PartyState.withdraw

    async def frozen_at_carol(self: PartyState, signed: Any) -> Any:
        if self.settings.index == 2:
            await asyncio.sleep(3600)
        return await carry_out(self, signed)

    monkeypatch.setattr(PartyState, "withdraw", frozen_at_carol)
    began = time.monotonic()
    rc, _, err = run_cli(capsys, s, "owner-a", "datasets", "withdraw", ds)
    took = time.monotonic() - began
    assert rc == 1 and "Carol: NOT confirmed: Carol did not answer WithdrawUploads within 6 s" \
        in err, err
    assert took < 5 + 1 + 10, took  # party_rpc_seconds + the extra, with room
    assert "Alice: confirmed" in err and "Bob: confirmed" in err
    assert all(_on_disk(s, 2, u) for u in mine)  # Carol never carried it out
