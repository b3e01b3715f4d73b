"""A data owner's withdrawal at the party daemons (real gRPC, mutual TLS, port 0): each
party checks the owner's signature itself, deletes exactly the uploads the withdrawal
covers, refuses their ids from then on, and answers with a receipt signed by its own
key; what a gateway could try with a withdrawal it relays deletes nothing else."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from nacl.signing import SigningKey
from party_harness import (
    Deployment,
    Owner,
    SealedUpload,
    Stub,
    data_upload,
    identities,
    run_parties,
    serve_parties,
    upload_messages,
)
from ppfs_party.server import PartyServer
from ppfs_party.state import open_state
from ppfs_party.store import WITHDRAWN

from ppfs.contract import Consent, Reveal
from ppfs.upload import SIGNED_AT_FORMAT
from ppfs.v1 import party_pb2
from ppfs.withdrawal import (
    ReceiptRejected,
    SignedWithdrawal,
    Withdrawal,
    WithdrawalReceipt,
    open_receipt,
)

COLS = ["a", "b", "c"]
ROWS = 6


def _upload(owner: Owner, box: list[bytes], upload_id: str, dataset_id: str = "ds",
            seed: int = 0) -> SealedUpload:
    raw = np.random.default_rng(seed).integers(-1000, 1000, size=(ROWS, 3))
    onehot = (np.arange(ROWS) % 2).reshape(ROWS, 1)
    return data_upload(owner, box, raw, COLS, [0, 0, 0], dataset_id=dataset_id,
                       upload_id=upload_id, onehot=onehot, label_column="y",
                       classes=("0", "1"))


def _staged(up: SealedUpload, party: int) -> Iterator[party_pb2.UploadPartChunk]:
    """``up``'s part sent staged: stored, waiting for the gateway's decision."""
    for n, msg in enumerate(upload_messages(up, party)):
        if n == 0:
            msg.header.staged = True
        yield msg


async def _send(stubs: list[Stub], up: SealedUpload, staged: bool = False) -> None:
    for i, stub in enumerate(stubs):
        await stub.PutUploadPart(_staged(up, i) if staged else upload_messages(up, i))


async def _held(stub: Stub, dataset_id: str = "ds") -> list[str]:
    listing = await stub.ListUploads(party_pb2.ListUploadsRequest(dataset_id=dataset_id))
    return [u.upload_id for u in listing.uploads]


async def _withdraw(stub: Stub, signed: SignedWithdrawal) -> party_pb2.WithdrawUploadsResponse:
    return await stub.WithdrawUploads(party_pb2.WithdrawUploadsRequest(
        statement=signed.statement, signature=signed.signature))


def _audit(dep: Deployment, party: int) -> list[dict[str, object]]:
    path = dep.settings[party].state_dir / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_withdrawal_deletes_the_owners_uploads_and_only_those(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        a, b = dep.owners["owner-a"], dep.owners["owner-b"]
        await _send(stubs, _upload(a, box, "u1"))
        await _send(stubs, _upload(a, box, "u2", seed=1))
        await _send(stubs, _upload(b, box, "u3", seed=2))  # another owner's, same data set
        await _send(stubs, _upload(a, box, "u4", dataset_id="ds2", seed=3))  # another set
        u5 = _upload(a, box, "u5", seed=4)
        await _send(stubs, u5, staged=True)  # staged, no decision yet
        assert await _held(stubs[0]) == ["u1", "u2", "u3", "u5"]

        signed = Withdrawal.now("owner-a", "ds").sign(a.key)
        keys = [i.signing_public_key for i in await identities(stubs)]
        for i, stub in enumerate(stubs):
            got = await _withdraw(stub, signed)
            r = open_receipt(signed, i, f"party {i}", keys[i], got.receipt,
                             got.receipt_signature)
            assert r.deleted == ("u1", "u2", "u5") and r.held == 0
            assert await _held(stub) == ["u3"]  # owner-b's stays
            assert await _held(stub, "ds2") == ["u4"]  # and owner-a's other data set
            info = await stub.GetDataset(party_pb2.GetDatasetRequest(dataset_id="ds"))
            assert (info.rows, list(info.upload_ids)) == (ROWS, ["u3"])
            state = dep.settings[i].state_dir
            for uid in ("u1", "u2"):
                assert not (state / "uploads" / uid).exists()
            assert not (state / "staged" / "u5").exists()
        # a withdrawn id is refused from then on: a part the gateway kept cannot return
        with pytest.raises(grpc.aio.AioRpcError):
            await stubs[0].PutUploadPart(upload_messages(_upload(a, box, "u1"), 0))
        with pytest.raises(grpc.aio.AioRpcError):
            await stubs[1].CommitUpload(
                party_pb2.UploadDecisionRequest(dataset_id="ds", upload_id="u5"))
        assert await _held(stubs[0]) == ["u3"]

        # asked again: nothing more to delete, the same promise
        again = await _withdraw(stubs[2], signed)
        r = WithdrawalReceipt.from_bytes(again.receipt)
        assert r.deleted == () and r.held == 0
        # the owner sends new rows; the old withdrawal, replayed, does not cover them
        await _send(stubs, _upload(a, box, "u6", seed=5))
        for stub in stubs:
            got = await _withdraw(stub, signed)
            assert WithdrawalReceipt.from_bytes(got.receipt).deleted == ()
            assert await _held(stub) == ["u3", "u6"]

    dep = run_parties(tmp_path, scenario, ("owner-a", "owner-b"))
    events = _audit(dep, 2)  # Carol was asked three times
    withdrawn = sorted(str(e["upload_id"]) for e in events if e["event"] == "upload.withdrawn")
    assert withdrawn == ["u1", "u2", "u5"]
    assert [e["uploads"] for e in events if e["event"] == "dataset.withdrawn"] == [3, 0, 0]


def test_a_withdrawal_not_signed_by_its_owner_deletes_nothing(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        a, b = dep.owners["owner-a"], dep.owners["owner-b"]
        await _send(stubs, _upload(a, box, "u1"))
        await _send(stubs, _upload(b, box, "u2", seed=1))
        w = Withdrawal.now("owner-a", "ds")
        consent = Consent("owner-a", "ds", "analyst", bytes(32), Reveal.SELECTION).sign(a.key)
        forged = [
            ("not signed by the key registered", w.sign(SigningKey.generate())),  # gateway's
            ("not signed by the key registered", w.sign(b.key)),  # another owner's key
            ("not registered", Withdrawal.now("stranger", "ds").sign(SigningKey.generate())),
            ("malformed", SignedWithdrawal(b'{"purpose":"ppfs consent v1"}', b"x" * 64)),
            # a statement the owner did sign, for another purpose: its consent
            ("malformed", SignedWithdrawal(consent.statement, consent.signature)),
        ]
        for why, signed in forged:
            for stub in stubs:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _withdraw(stub, signed)
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert why in (info.value.details() or ""), info.value.details()
                assert await _held(stub) == ["u1", "u2"]
        # a withdrawal signed before the upload was made does not reach it
        earlier = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).strftime(
            SIGNED_AT_FORMAT)
        old = Withdrawal("owner-a", "ds", earlier).sign(a.key)
        got = await _withdraw(stubs[0], old)
        assert WithdrawalReceipt.from_bytes(got.receipt).deleted == ()
        assert await _held(stubs[0]) == ["u1", "u2"]

    dep = run_parties(tmp_path, scenario, ("owner-a", "owner-b"))
    assert not any(e["event"] == "upload.withdrawn" for e in _audit(dep, 0))


def test_the_client_refuses_a_receipt_it_cannot_trust(tmp_path: Path) -> None:
    # what a gateway could hand the owner instead of a party's receipt
    owner, alice, bob = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    signed = Withdrawal.now("owner-a", "ds").sign(owner)
    other = Withdrawal.now("owner-a", "ds2").sign(owner)
    alice_key = bytes(alice.verify_key)

    def receipt(**kw: object) -> WithdrawalReceipt:
        base: dict[str, object] = dict(withdrawal_sha256=signed.digest, party_index=0,
                                       owner_id="owner-a", dataset_id="ds", deleted=("u1",),
                                       held=0)
        return WithdrawalReceipt(**{**base, **kw})  # type: ignore[arg-type]

    good, sig = receipt().sign(alice)
    assert open_receipt(signed, 0, "Alice", alice_key, good, sig).deleted == ("u1",)
    cases = [
        ("sent no signed receipt", b"", b""),
        ("not signed by Alice's certified key", *receipt().sign(bob)),
        ("not signed by Alice's certified key", good, sig[:-1] + bytes([sig[-1] ^ 1])),
        ("for another withdrawal or party", *receipt(party_index=1).sign(alice)),
        ("for another withdrawal or party",
         *receipt(withdrawal_sha256=other.digest, dataset_id="ds2").sign(alice)),
        ("still holds 1 of the uploads withdrawn", *receipt(held=1).sign(alice)),
        ("malformed", b"{}", alice.sign(b"{}").signature),
    ]
    for why, statement, signature in cases:
        with pytest.raises(ReceiptRejected, match=why):
            open_receipt(signed, 0, "Alice", alice_key, statement, signature)


def test_a_withdrawal_cut_short_is_finished_at_the_next_start(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        a = dep.owners["owner-a"]
        await _send(stubs, _upload(a, box, "u1"))
        await _send(stubs, _upload(a, box, "u2", seed=1))

    dep = run_parties(tmp_path, scenario)
    state = dep.settings[0].state_dir
    # the crash came after u1's tombstone was durable, before its directory went
    (state / "aborted" / "u1").write_bytes(WITHDRAWN + b"ds")
    assert (state / "uploads" / "u1").is_dir()
    reopened = open_state(dep.settings[0])
    assert not (state / "uploads" / "u1").exists()
    assert [u.manifest.upload_id for u in reopened.store.held_uploads("ds")] == ["u2"]
    assert reopened.store.status("u1") == "aborted"


def test_a_part_withdrawn_before_it_arrived_is_refused_also_after_a_restart(
    tmp_path: Path,
) -> None:
    # a turned gateway keeps back an owner's sealed part and delivers it after the
    # owner's withdrawal: the party keeps the withdrawal and refuses what it covers
    held_back: list[SealedUpload] = []

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        a = dep.owners["owner-a"]
        held_back.append(_upload(a, box, "u7", seed=7))  # signed now, never delivered
        await _send(stubs, _upload(a, box, "u1"))
        signed = Withdrawal.now("owner-a", "ds").sign(a.key)
        for stub in stubs:
            await _withdraw(stub, signed)
        for i, stub in enumerate(stubs):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.PutUploadPart(upload_messages(held_back[0], i))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "withdrawn by its owner" in (info.value.details() or "")
        await _send(stubs, _upload(a, box, "u8", seed=8))  # signed after it: accepted
        assert await _held(stubs[0]) == ["u8"]

    dep = run_parties(tmp_path, scenario)

    async def after_restart(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                            box: list[bytes]) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs[1].PutUploadPart(upload_messages(held_back[0], 1))
        assert "withdrawn by its owner" in (info.value.details() or "")

    serve_parties(dep, after_restart)
