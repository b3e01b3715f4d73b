"""An owner checks that its upload is held by every party, in each party's own signed
words, and a turned gateway that says an upload was added when a party does not hold
it, or that forges, swaps or replays a party's statement, is caught.

Real party daemons (in this process, over gRPC) and the real gateway; the gateway is
turned by replacing its calls to the parties (ppfs_gateway.parties.PartyClient)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey
from ppfs_client.sdk import ApiError, GatewayClient, UploadNotConfirmed
from ppfs_gateway.parties import PartyClient
from service_fakes import Stack, owner_table, run_cli

from ppfs.holdings import HoldingsStatement
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2 as pb

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


# the `stack` fixture (conftest.py): the real party daemons, in this process
PARTY_DAEMONS = True


def _csv(tmp_path: Path, rows: int, seed: int) -> Path:
    t = make_table(rows, 3, seed=seed)
    path = tmp_path / f"data-{seed}.csv"
    lines = [",".join([*t.columns, "label"])]
    lines += [",".join([*(repr(float(v)) for v in t.x[i]), str(t.y[i])]) for i in range(t.m)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _held_at(s: Stack, party: int, ds: str) -> dict[str, str]:
    store = s.cluster.servers[party].state.store
    return {u.manifest.upload_id: status for u, status in store.listing(ds)}


def _commit_never_sent(monkeypatch: pytest.MonkeyPatch, at: tuple[int, ...] = (2,)) -> None:
    """The gateway never sends the parties ``at`` (Carol) a commit, and acknowledges it
    in their name."""
    decide = PartyClient.decide_upload

    async def turned(self: PartyClient, dataset_id: str, upload_id: str, commit: bool,
                     timeout: float | None = None) -> Any:
        if self.index in at and commit:
            return pb.UploadDecisionResponse(upload_id=upload_id,
                                             status=pb.UPLOAD_STATUS_COMMITTED)
        return await decide(self, dataset_id, upload_id, commit, timeout)

    monkeypatch.setattr(PartyClient, "decide_upload", turned)


def _left_out_of_the_record(monkeypatch: pytest.MonkeyPatch, upload_id: str) -> None:
    """The gateway's answer to `check` leaves ``upload_id`` out of its record."""
    check = GatewayClient.check_dataset

    def hiding(self: GatewayClient, dataset_id: str) -> dict[str, Any]:
        got = check(self, dataset_id)
        got["recorded"] = [u for u in got["recorded"] if u["upload_id"] != upload_id]
        return got

    monkeypatch.setattr(GatewayClient, "check_dataset", hiding)


def test_an_upload_is_confirmed_by_every_partys_signed_statement(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    rc, out, err = run_cli(capsys, s, "owner-a", "upload", str(_csv(tmp_path, 12, 1)),
                           "--label", "label", "--dataset", "held")
    assert rc == 0, err
    assert "held committed by Alice, Bob, Carol, each by its signed statement" in err
    ds = out.strip()
    rc, _, err = run_cli(capsys, s, "owner-a", "datasets", "holdings", ds)
    assert rc == 0, err
    for name in ("Alice", "Bob", "Carol"):
        assert f"{name}: holds 1 committed (its signed statement)" in err, err
    # another owner holds nothing of its own there, and is told so
    s.client("admin").grant(ds, "owner-b")
    rc, _, err = run_cli(capsys, s, "owner-b", "datasets", "holdings", ds)
    assert rc == 0 and "Carol: holds none of your uploads" in err, err


def test_a_gateway_that_never_commits_a_part_cannot_tell_the_owner_it_was_added(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("withheld")["id"]
    t = make_table(20, 3, seed=3)
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 10)), ds)
    _commit_never_sent(monkeypatch)
    exps = a.get_dataset(ds)["column_exponents"]
    with pytest.raises(UploadNotConfirmed) as info:
        a.upload_table(s.keys["owner-a"], owner_table(t, slice(10, 20)), ds, exponents=exps)
    said = str(info.value)
    assert "Carol did not confirm it holds it: it holds upload" in said, said
    assert "staged, not committed" in said and "Alice" not in said and "Bob" not in said
    assert sorted(_held_at(s, 2, ds).values()) == ["committed", "staged"]
    # and the gateway's record says it was added: the owner's check names Carol
    assert len(a.get_dataset(ds)["upload_ids"]) == 2
    rc, _, err = run_cli(capsys, s, "owner-a", "datasets", "holdings", ds)
    assert rc == 1 and "Carol: NOT holding: it holds upload" in err, err
    assert "Alice: holds 2 committed" in err and "Carol: holds 1 committed, 1 staged" in err


def test_a_gateway_that_forges_swaps_or_replays_a_statement_is_caught(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("statements")["id"]
    t = make_table(40, 3, seed=5)
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 10)), ds)
    relay = PartyClient.state_holdings
    kept: dict[int, pb.StateHoldingsResponse] = {}

    async def recording(self: PartyClient, dataset_id: str, owner_id: str,
                        challenge: bytes) -> Any:
        kept[self.index] = await relay(self, dataset_id, owner_id, challenge)
        return kept[self.index]

    monkeypatch.setattr(PartyClient, "state_holdings", recording)
    assert run_cli(capsys, s, "owner-a", "datasets", "holdings", ds)[0] == 0
    own_key = SigningKey.generate()  # the gateway's: not a party's certified key
    clients: dict[int, PartyClient] = {}

    def turned(how: str) -> Any:
        async def state_holdings(self: PartyClient, dataset_id: str, owner_id: str,
                                 challenge: bytes) -> Any:
            clients[self.index] = self
            if self.index != 2:
                return await relay(self, dataset_id, owner_id, challenge)
            if how == "forged":  # Carol never asked; the gateway answers in her name
                real = HoldingsStatement.from_bytes(kept[2].statement)
                blob, sig = HoldingsStatement(2, owner_id, dataset_id, challenge.hex(),
                                              real.uploads).sign(own_key)
                return pb.StateHoldingsResponse(statement=blob, signature=sig)
            if how == "swapped":  # Alice's real statement, as Carol's
                return await relay(clients[0], dataset_id, owner_id, challenge)
            return kept[2]  # Carol's real statement, answering an earlier challenge
        return state_holdings

    for k, (how, why) in enumerate((
            ("forged", "Carol's receipt is not signed by Carol's certified key"),
            ("swapped", "Carol's receipt is not signed by Carol's certified key"),
            ("replayed", "Carol's statement of holdings answers another request")), 1):
        monkeypatch.setattr(PartyClient, "state_holdings", turned(how))
        rc, _, err = run_cli(capsys, s, "owner-a", "datasets", "holdings", ds)
        assert rc == 1 and f"Carol: NOT confirmed: {why}" in err, (how, err)
        # every statement-only forgery leaves the parties holding the upload: one more
        assert f"Alice: holds {k} committed" in err and f"Bob: holds {k} committed" in err
        with pytest.raises(UploadNotConfirmed, match=f"Carol did not confirm it holds it: "
                                                     f"{why}"):
            a.upload_table(s.keys["owner-a"], owner_table(t, slice(10 * k, 10 * k + 10)), ds,
                           exponents=a.get_dataset(ds)["column_exponents"])


def test_a_party_refuses_a_request_without_a_proper_challenge(stack: Stack) -> None:
    s = stack
    party = s.cluster.servers[0].state
    for owner, ds, challenge, why in (
            ("owner-a", "d1", b"short", "32-byte challenge"),
            ("owner a", "d1", bytes(32), "names its owner by subject id"),
            ("owner-a", "../d1", bytes(32), "names its data set by id")):
        with pytest.raises(Exception, match=why):
            party.holdings(owner, ds, challenge)


def test_a_gateway_that_leaves_an_upload_out_of_its_record_cannot_hide_that_a_party_lacks_it(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ppfs datasets holdings` checks every upload a party's signed statement lists,
    not only those the gateway's record names: a gateway that never commits Carol's part
    and then leaves the upload out of its record is still caught."""
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("unrecorded")["id"]
    t = make_table(20, 3, seed=7)
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 10)), ds)
    _commit_never_sent(monkeypatch)
    with pytest.raises(UploadNotConfirmed):
        a.upload_table(s.keys["owner-a"], owner_table(t, slice(10, 20)), ds,
                       exponents=a.get_dataset(ds)["column_exponents"])
    staged = next(u for u, st in _held_at(s, 2, ds).items() if st == "staged")
    _left_out_of_the_record(monkeypatch, staged)
    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "holdings", ds, "--json")
    assert rc == 1, err
    said = json.loads(out)
    assert {"party": "Carol", "reason": f"it holds upload {staged} staged, not committed"} \
        in said["not_holding"], said
    assert [n["party"] for n in said["not_holding"]] == ["Carol"], said


@pytest.mark.parametrize("answer", [{"parties": None}, {"parties": 7}, {},
                                    {"parties": [{"index": 2, "receipt": ["x"]}, "Carol"]}])
def test_a_malformed_answer_to_the_holdings_route_leaves_the_upload_unconfirmed(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any]
) -> None:
    """Whatever the gateway answers on the holdings route, `upload_table` raises
    UploadNotConfirmed naming every party, never another error type an SDK caller would
    not expect after its rows were sent."""
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("malformed")["id"]
    call = GatewayClient._call

    def turned(self: GatewayClient, method: str, path: str, body: Any = None) -> Any:
        return answer if path.endswith("/holdings") else call(self, method, path, body)

    monkeypatch.setattr(GatewayClient, "_call", turned)
    with pytest.raises(UploadNotConfirmed) as info:
        a.upload_table(s.keys["owner-a"], owner_table(make_table(10, 3, seed=9)), ds)
    for name in ("Alice", "Bob", "Carol"):
        assert f"{name} did not confirm it holds it" in str(info.value), info.value


def test_a_retried_upload_is_not_called_added_on_the_gateways_word(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway aborts an upload at every party, records it as added and drops the
    owner's connection before the client could check the parties' statements. Run
    again, the upload is not refused as "part of the data set" on the gateway's record:
    the parties' signed statements, which do not list it, are asked first."""
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("retried")["id"]
    t = make_table(10, 3, seed=11)
    decide = PartyClient.decide_upload

    async def turned(self: PartyClient, dataset_id: str, upload_id: str, commit: bool,
                     timeout: float | None = None) -> Any:
        if commit:  # aborted at the party, acknowledged as committed in its name
            await decide(self, dataset_id, upload_id, False, timeout)
            return pb.UploadDecisionResponse(upload_id=upload_id,
                                             status=pb.UPLOAD_STATUS_COMMITTED)
        return await decide(self, dataset_id, upload_id, commit, timeout)

    post = GatewayClient.post_upload

    def dropped(self: GatewayClient, dataset_id: str, body: dict[str, Any],
                progress: Any = None) -> dict[str, Any]:
        post(self, dataset_id, body, progress)
        raise ApiError(0, "gateway unreachable", "the connection was dropped")

    monkeypatch.setattr(PartyClient, "decide_upload", turned)
    monkeypatch.setattr(GatewayClient, "post_upload", dropped)
    with pytest.raises(ApiError, match="Running the same upload again"):
        a.upload_table(s.keys["owner-a"], owner_table(t), ds)
    (upload_id,) = a.get_dataset(ds)["upload_ids"]  # the gateway's record: added
    assert all(_held_at(s, i, ds) == {} for i in range(3))  # no party holds it
    monkeypatch.undo()
    with pytest.raises(UploadNotConfirmed) as info:
        a.upload_table(s.keys["owner-a"], owner_table(t), ds)
    said = str(info.value)
    for name in ("Alice", "Bob", "Carol"):
        assert (f"{name} did not confirm it holds it: its signed statement does not list "
                f"upload {upload_id}") in said, said


@pytest.mark.parametrize("other", ["owner", "dataset"])
def test_a_gateway_that_asks_a_party_about_another_owner_or_data_set_is_caught(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """Carol's genuine statement, answering the owner's very challenge, but of another
    owner's uploads (which hold the upload the gateway wants to pass off) or of another
    data set: refused, naming Carol."""
    s = stack
    a, b = s.client("owner-a"), s.client("owner-b")
    ds = a.create_dataset("mine")["id"]
    ds2 = a.create_dataset("mine-too")["id"]
    s.client("admin").grant(ds, "owner-b")
    t = make_table(20, 3, seed=13)
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 10)), ds2)
    b.upload_table(s.keys["owner-b"], owner_table(t, slice(0, 10)), ds)
    relay = PartyClient.state_holdings

    async def turned(self: PartyClient, dataset_id: str, owner_id: str,
                     challenge: bytes) -> Any:
        if self.index == 2:
            if other == "owner":
                owner_id = "owner-b"
            else:
                dataset_id = ds2
        return await relay(self, dataset_id, owner_id, challenge)

    monkeypatch.setattr(PartyClient, "state_holdings", turned)
    h = a.holdings(s.keys["owner-a"], ds)
    assert [n for n, _ in h.confirmed] == ["Alice", "Bob"]
    assert h.unconfirmed == (
        ("Carol", "Carol's statement of holdings is for another party, owner or data set"),)


def test_an_upload_staged_only_and_unrecorded_is_named_not_counted_as_missing(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload every party holds only staged (its commit never sent) and that the
    gateway does not record is in no data set: `datasets holdings` names it as such and
    does not fail for it, as it does for one some party holds committed."""
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("undecided")["id"]
    t = make_table(20, 3, seed=15)
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 10)), ds)
    _commit_never_sent(monkeypatch, at=(0, 1, 2))  # at any party
    with pytest.raises(UploadNotConfirmed):
        a.upload_table(s.keys["owner-a"], owner_table(t, slice(10, 20)), ds,
                       exponents=a.get_dataset(ds)["column_exponents"])
    (staged,) = [u for u, st in _held_at(s, 0, ds).items() if st == "staged"]
    _left_out_of_the_record(monkeypatch, staged)
    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "holdings", ds, "--json")
    assert rc == 0, err
    said = json.loads(out)
    assert said["staged_only"] == [staged] and said["not_holding"] == [], said
    assert f"upload {staged}: staged only, committed by no party" in err, err
