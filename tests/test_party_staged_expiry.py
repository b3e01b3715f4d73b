"""Staged upload parts expire at the party: a part the gateway never decides (its
decision lost, the gateway replaced, or a gateway that stages parts and walks away) is
aborted by the party itself once it is older than ``--staged-expiry-hours``, exactly as
the gateway's abort does (tombstone first: a late commit, or a late copy of the part
without its owner's signed repair, is refused), logged and audited. Its age is the time
the party recorded when it stored the part; the clock is injected, nothing sleeps for
hours."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey
from party_harness import (
    Deployment,
    Owner,
    SealedUpload,
    StoreParty,
    data_upload,
    identities,
    put_part,
    upload_messages,
)
from ppfs_party.config import DEFAULT_STAGED_EXPIRY, PartySettings
from ppfs_party.errors import StorageError, UploadDecisionError, UploadReplayedError
from ppfs_party.server import start_party_server
from ppfs_party.store import ShareStore, UploadHeader

from ppfs.errors import ParameterError
from ppfs.upload import SIGNED_AT_FORMAT, Repair, UploadRejected
from ppfs.v1 import party_pb2, party_pb2_grpc
from ppfs.withdrawal import Withdrawal

HOUR = 3600.0
DAY = 24 * HOUR
T0 = 1_800_000_000.0  # the party's clock when the first part arrives
ROWS = 6


def _upload(owner: Owner, box: list[bytes], upload_id: str) -> SealedUpload:
    raw = np.random.default_rng(3).integers(-1000, 1000, size=(ROWS, 3))  # test data
    onehot = (np.arange(ROWS) % 2).reshape(ROWS, 1)
    return data_upload(owner, box, raw, ["a", "b", "c"], [0, 0, 0], dataset_id="ds",
                       upload_id=upload_id, onehot=onehot, label_column="y",
                       classes=("0", "1"))


@pytest.fixture
def party(tmp_path: Path) -> StoreParty:
    return StoreParty.create(tmp_path, seed=3, now=T0)


async def _assert_expired(store: ShareStore, party: StoreParty, upload_id: str) -> None:
    """Aborted as the gateway's abort leaves it: tombstoned, its directory gone, a late
    commit refused naming the expiry, a late copy of the part refused."""
    assert store.status(upload_id) == "aborted"
    assert (party.state / "aborted" / upload_id).is_file()
    assert not (party.state / "staged" / upload_id).exists()
    assert not [p for p in (party.state / "staged").iterdir() if p.name.startswith(".")]
    with pytest.raises(UploadDecisionError, match=f"{upload_id!r} was aborted on this "
                       "party: its staged part expired"):
        await store.commit("ds", upload_id)
    # a copy of the part, without its owner's repair: refused
    with pytest.raises(UploadRejected, match="expired here undecided, and no repair signed "
                       "by its owner came with it"):
        await put_part(store, party.sealed(upload_id))
    assert upload_id not in {u.manifest.upload_id for u, _ in store.listing("ds")}
    assert not (party.state / "uploads" / upload_id).exists()


def test_part_past_its_age_is_aborted_one_within_it_is_kept(
    party: StoreParty, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        store = party.store()
        old = await put_part(store, party.sealed("u-old"))
        party.now = T0 + 20 * HOUR
        await put_part(store, party.sealed("u-new"))
        await put_part(store, party.sealed("u-done"))
        assert await store.commit("ds", "u-done") == "committed"

        party.now = T0 + 23 * HOUR  # nothing is old enough yet
        assert await store.expire_staged() == []
        assert store.status("u-old") == "staged"

        party.now = T0 + DAY + 1
        with caplog.at_level("INFO", logger="ppfs.party"):
            assert await store.expire_staged() == ["u-old"]
        await _assert_expired(store, party, "u-old")
        assert store.status("u-new") == "staged"  # 4 h old: kept, still committable
        assert await store.commit("ds", "u-new") == "committed"
        assert store.status("u-done") == "committed"  # a committed upload never expires
        assert await store.expire_staged(T0 + 100 * DAY) == []
        assert [u.manifest.upload_id for u in store.held_uploads("ds")] == ["u-done", "u-new"]

        (event,) = party.audit("upload.expired")
        assert event["upload_id"] == "u-old" and event["dataset_id"] == "ds"
        assert event["age_seconds"] == int(DAY + 1)
        assert event["expiry_seconds"] == int(DAY)
        assert not party.audit("upload.aborted")  # the gateway did not ask for it
        # ids and ages only: nothing of the part's contents
        assert set(event) == {"ts", "event", "dataset_id", "upload_id", "age_seconds",
                              "expiry_seconds"}
        logged = [r.getMessage() for r in caplog.records if "expired" in r.getMessage()]
        assert len(logged) == 1 and "upload=u-old" in logged[0] and "dataset=ds" in logged[0]
        assert old.manifest.part_sha256[0] not in logged[0]

    asyncio.run(scenario())


def test_age_is_the_partys_own_record_of_receipt(party: StoreParty) -> None:
    # what the party wrote when it stored the part decides, whatever happens to the
    # directory's times since (a restore, a touch, the rename out of the temporary name)
    async def scenario() -> None:
        store = party.store()
        await put_part(store, party.sealed("u1"))
        recorded = party.state / "staged" / "u1" / "received_at"
        assert float(recorded.read_text()) == T0
        os.utime(party.state / "staged" / "u1", (T0 + 30 * DAY, T0 + 30 * DAY))
        assert await store.expire_staged(T0 + DAY + 1) == ["u1"]

    asyncio.run(scenario())


def test_restart_expires_a_part_that_aged_while_the_daemon_was_down(party: StoreParty) -> None:
    async def scenario() -> None:
        first = party.store()
        await put_part(first, party.sealed("u1"))
        party.now = T0 + 2 * HOUR
        await put_part(first, party.sealed("u2"))

        party.now = T0 + DAY + 60  # the daemon was down meanwhile: u1 aged past its day
        again = party.store()
        assert again.status("u1") == "staged"  # open() alone decides nothing
        assert await again.expire_staged() == ["u1"]
        await _assert_expired(again, party, "u1")
        assert again.status("u2") == "staged"

        third = party.store()  # the expiry, and its reason, outlive the next restart
        await _assert_expired(third, party, "u1")
        assert await third.abort("ds", "u1") == "aborted"  # the gateway's abort: idempotent
        assert third.status("u2") == "staged"

    asyncio.run(scenario())


def test_part_stored_before_the_party_recorded_receipt_ages_from_its_manifest(
    party: StoreParty,
) -> None:
    # a staged part an older version stored has no received_at: the time the party
    # wrote its manifest stands in (a file's modification time, never changed since)
    async def scenario() -> None:
        store = party.store()
        await put_part(store, party.sealed("u1"))
        staged = party.state / "staged" / "u1"
        (staged / "received_at").unlink()
        os.utime(staged / "manifest.json", (T0 - 2 * DAY, T0 - 2 * DAY))
        again = party.store()
        assert await again.expire_staged(T0) == ["u1"]
        await _assert_expired(again, party, "u1")

    asyncio.run(scenario())


def _repair(party: StoreParty, up: SealedUpload, *, at: float | None = None,
            index: int = 0, key: SigningKey | None = None) -> tuple[bytes, bytes]:
    """The owner's repair of ``up`` for party ``index``, signed at ``at`` (party clock)."""
    r = Repair.now(up.manifest, index)
    if at is not None:
        r = replace(r, signed_at=dt.datetime.fromtimestamp(at, dt.UTC).strftime(
            SIGNED_AT_FORMAT))
    return r.sign(key or party.owner.key)


async def _expired_part(party: StoreParty) -> tuple[ShareStore, SealedUpload]:
    """Owner-a's part "u1", stored staged, then expired here (two days undecided)."""
    store = party.store()
    up = party.sealed("u1")
    await put_part(store, up)
    party.now = T0 + 2 * DAY
    assert await store.expire_staged() == ["u1"]
    return store, up


def test_only_the_owners_fresh_repair_brings_an_expired_part_back(party: StoreParty) -> None:
    """A part this party expired undecided may be committed at the other parties (this
    one was cut off meanwhile): its owner's signed repair stores it again, to be
    committed. A copy without one, a repair not signed by the owner, stale, or for
    another party or upload is refused; so is any part once the gateway aborted it."""
    async def scenario() -> None:
        store, up = await _expired_part(party)
        other = party.sealed("u2")
        refused = {
            "no repair signed by its owner": (b"", b""),
            "not signed by the upload's owner": _repair(party, up, key=SigningKey.generate()),
            "for another upload, manifest or party": _repair(party, up, index=1),
            "not within the last 1 h": _repair(party, up, at=party.now - 2 * HOUR),
        }
        forged_statement, _ = _repair(party, other)
        refused["another upload's repair"] = (forged_statement,
                                              party.owner.key.sign(forged_statement).signature)
        for why, repair in refused.items():
            with pytest.raises(UploadRejected) as info:
                await put_part(store, up, repair=repair)
            assert "expired here undecided" in str(info.value), why
            assert store.status("u1") == "aborted", why
        # the owner's repair, but the part sent to be committed at once: refused (a
        # crash before its tombstone was lifted would leave it committed and unused)
        with pytest.raises(UploadRejected, match="a repaired part is sent staged"):
            await put_part(store, up, staged=False, repair=_repair(party, up))
        assert store.status("u1") == "aborted"
        # the owner's repair, signed now: staged again, then committed by the gateway
        await put_part(store, up, repair=_repair(party, up, at=party.now - 60))
        assert store.status("u1") == "staged"
        assert not (party.state / "aborted" / "u1").exists()
        assert await store.commit("ds", "u1") == "committed"
        again = party.store()  # and so after a restart
        assert again.status("u1") == "committed"
        assert [u.manifest.upload_id for u in again.held_uploads("ds")] == ["u1"]

        # the gateway's abort of an expired part decides it: no repair brings it back
        await put_part(again, other)
        party.now = T0 + 5 * DAY
        assert await again.expire_staged() == ["u2"]
        assert await again.abort("ds", "u2") == "aborted"
        for store_now in (again, party.store()):
            with pytest.raises(UploadReplayedError, match="aborted"):
                await put_part(store_now, other, repair=_repair(party, other))
            assert store_now.status("u2") == "aborted"

    asyncio.run(scenario())


def test_a_withdrawn_expired_part_stays_refused_with_a_repair(party: StoreParty) -> None:
    async def scenario() -> None:
        store, up = await _expired_part(party)
        w = Withdrawal(party.owner.owner_id, "ds",
                       dt.datetime.fromtimestamp(party.now, dt.UTC).strftime(SIGNED_AT_FORMAT))
        signed = w.sign(party.owner.key)
        await store.withdraw(signed, w)
        with pytest.raises(UploadRejected, match="withdrawn by its owner"):
            await put_part(store, up, repair=_repair(party, up))
        assert store.status("u1") == "aborted"

    asyncio.run(scenario())


def test_expiry_setting_and_flag(tmp_path: Path) -> None:
    from ppfs_cli.main import build_parser
    from ppfs_party.commands import _settings

    base = ["party", "serve", "--state-dir", str(tmp_path), "--index", "0"]
    parse = build_parser("party").parse_args
    assert _settings(parse(base)).staged_expiry == DEFAULT_STAGED_EXPIRY == DAY
    got = _settings(parse([*base, "--staged-expiry-hours", "2.5"]))
    assert got.staged_expiry == 2.5 * HOUR
    for bad in (0.0, -1.0):
        with pytest.raises(ParameterError, match="staged_expiry"):
            PartySettings(state_dir=tmp_path, index=0, staged_expiry=bad)


# ------------------------------------------------------------ a real daemon

Stub = party_pb2_grpc.PartyServiceStub


def _staged_messages(up: SealedUpload, party: int) -> Iterator[party_pb2.UploadPartChunk]:
    for msg in upload_messages(up, party):
        if msg.WhichOneof("part") == "header":
            msg.header.staged = True
        yield msg


def test_daemon_expires_on_start_and_while_it_runs(tmp_path: Path) -> None:
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    owner = dep.add_owner("owner-a")
    # an expiry of two seconds: the daemon checks several times within it
    settings = replace(dep.settings[0], staged_expiry=2.0)
    hourly = replace(settings, staged_expiry=HOUR)

    async def scenario() -> None:
        srv = await start_party_server(settings)
        channel = dep.channel(0, srv.port)
        try:
            stub = Stub(channel)
            (me,) = await identities([stub])
            box = [me.box_public_key, *(bytes(PrivateKey.generate().public_key),) * 2]
            await stub.PutUploadPart(_staged_messages(_upload(owner, box, "u-run"), 0))
            assert srv.state.store.status("u-run") == "staged"
            deadline = time.monotonic() + 10
            while srv.state.store.status("u-run") == "staged":  # the periodic check
                assert time.monotonic() < deadline, "the running daemon never expired it"
                await asyncio.sleep(0.2)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.CommitUpload(
                    party_pb2.UploadDecisionRequest(dataset_id="ds", upload_id="u-run"))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "its staged part expired" in (info.value.details() or "")

            # with an expiry of an hour: a part stored, then the daemon stopped for longer
            await srv.stop(0)
            await channel.close()
            srv = await start_party_server(hourly)
            channel = dep.channel(0, srv.port)
            stub = Stub(channel)
            await stub.PutUploadPart(_staged_messages(_upload(owner, box, "u-down"), 0))
            await srv.stop(0)
            await channel.close()
            recorded = settings.state_dir / "staged" / "u-down" / "received_at"
            assert abs(float(recorded.read_text()) - time.time()) < 60
            recorded.write_text(f"{time.time() - 2 * HOUR:.3f}\n")  # as if two hours ago
            srv = await start_party_server(hourly)
            channel = dep.channel(0, srv.port)
            stub = Stub(channel)
            # expired before the daemon answers its first call
            assert srv.state.store.status("u-down") == "aborted"
            assert not (settings.state_dir / "staged" / "u-down").exists()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.CommitUpload(
                    party_pb2.UploadDecisionRequest(dataset_id="ds", upload_id="u-down"))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "its staged part expired" in (info.value.details() or "")
            expired = [e["upload_id"] for e in srv.state.audit.entries()
                       if e["event"] == "upload.expired"]
            assert expired == ["u-run", "u-down"]
        finally:
            await channel.close()
            await srv.stop(0)

    asyncio.run(scenario())


def test_a_withdrawal_while_a_repair_arrives_keeps_the_part_out(party: StoreParty) -> None:
    """The owner withdraws the data set while the repaired part of an upload this party
    expired is still arriving: the withdrawal wins, the part is not stored (it would
    otherwise outlive a withdrawal carried out before it was stored)."""
    async def scenario() -> None:
        store, up = await _expired_part(party)
        go = asyncio.Event()

        async def chunks() -> AsyncIterator[bytes]:
            await go.wait()  # the withdrawal is carried out meanwhile
            yield up.parts[0]

        header = UploadHeader(up.dataset_id, up.upload_id, up.owner_id, up.manifest,
                              up.signature, len(up.parts[0]), True,
                              *_repair(party, up, at=party.now - 60))
        arriving = asyncio.create_task(store.put(header, chunks()))
        await asyncio.sleep(0.05)
        w = Withdrawal(party.owner.owner_id, "ds",
                       dt.datetime.fromtimestamp(party.now, dt.UTC).strftime(SIGNED_AT_FORMAT))
        await store.withdraw(w.sign(party.owner.key), w)
        go.set()
        with pytest.raises(UploadRejected, match="withdrawn by its owner"):
            await arriving
        assert store.status("u1") == "aborted"
        assert not (party.state / "staged" / "u1").exists()
        assert party.store().status("u1") == "aborted"

    asyncio.run(scenario())


@pytest.mark.parametrize("failing", ["_commit", "_lift_tombstone"])
def test_a_repair_that_cannot_be_stored_leaves_the_id_refused(
    party: StoreParty, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The repaired part of an expired upload fails to be written (a full disk, or a
    crash): its id stays refused without a repair, now and after a restart, so the
    gateway cannot later stage the part again on a repair that has gone stale."""
    async def scenario() -> None:
        store, up = await _expired_part(party)

        def disk_full(*args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(store, failing, disk_full)
        with pytest.raises(StorageError):
            await put_part(store, up, repair=_repair(party, up, at=party.now - 60))
        monkeypatch.undo()
        party.now += 2 * HOUR  # the repair is stale now
        for store_now in (store, party.store()):
            assert store_now.status("u1") == "aborted"
            assert not (party.state / "staged" / "u1").exists()
            with pytest.raises(UploadRejected, match="expired here undecided"):
                await put_part(store_now, up)
            assert store_now.status("u1") == "aborted"
        # a fresh repair still brings it back, staged
        await put_part(store, up, repair=_repair(party, up, at=party.now - 60))
        assert store.status("u1") == "staged"

    asyncio.run(scenario())


def test_a_repair_brings_a_part_back_once_where_parts_expire_within_the_hour(
    party: StoreParty,
) -> None:
    """A party whose staged parts expire sooner than a repair stays fresh: the gateway
    that keeps the owner's repair and lets the part it brought back expire again cannot
    stage it once more with the same repair."""
    async def scenario() -> None:
        store = party.store(staged_expiry=0.25 * HOUR)
        up = party.sealed("u1")
        await put_part(store, up)
        party.now = T0 + HOUR
        assert await store.expire_staged() == ["u1"]
        repair = _repair(party, up, at=party.now - 60)
        await put_part(store, up, repair=repair)
        assert store.status("u1") == "staged"
        party.now += 0.25 * HOUR  # undecided again: expired again
        assert await store.expire_staged() == ["u1"]
        with pytest.raises(UploadRejected, match="expired here undecided"):
            await put_part(store, up, repair=repair)
        assert store.status("u1") == "aborted"
        # a repair the owner signs now brings it back
        await put_part(store, up, repair=_repair(party, up, at=party.now - 60))
        assert store.status("u1") == "staged"

    asyncio.run(scenario())
