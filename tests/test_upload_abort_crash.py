"""Crash points of a party's upload decisions: an upload aborted on a party is never
committed or used there, wherever the daemon stopped (between the tombstone and the
deletion, in the middle of the deletion, after an older version committed it, with
the tombstone write failing), and a commit racing an abort leaves one decision that a
restart keeps. The crash is played by making a step raise, or by laying out the
on-disk state it leaves, then restarting the store (or the daemon) from disk."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from party_harness import (
    Deployment,
    Owner,
    SealedUpload,
    StoreParty,
    data_upload,
    describe_job,
    identities,
    mask_upload,
    put_part,
    start_requests,
    upload_messages,
)
from ppfs_party import store as store_module
from ppfs_party.errors import (
    NotFoundError,
    StorageError,
    UploadDecisionError,
    UploadReplayedError,
)
from ppfs_party.server import start_party_server
from ppfs_party.store import ShareStore

from ppfs.v1 import party_pb2, party_pb2_grpc

COLS = ["a", "b", "c"]
ROWS = 6


class SimulatedCrash(Exception):
    """The daemon stops here (nothing after this step runs)."""


def _upload(owner: Owner, box: list[bytes], upload_id: str) -> SealedUpload:
    raw = np.random.default_rng(5).integers(-1000, 1000, size=(ROWS, 3))  # test data
    onehot = (np.arange(ROWS) % 2).reshape(ROWS, 1)
    return data_upload(owner, box, raw, COLS, [0, 0, 0], dataset_id="ds", upload_id=upload_id,
                       onehot=onehot, label_column="y", classes=("0", "1"))


# ------------------------------------------------------------ one party's store, direct


@pytest.fixture
def party(tmp_path: Path) -> StoreParty:
    return StoreParty.create(tmp_path, seed=5)


async def _assert_never_usable(store: ShareStore, party: StoreParty, upload_id: str) -> None:
    """Aborted on this party: not committable, not held, not listed, not re-accepted."""
    assert store.status(upload_id) == "aborted"
    with pytest.raises(UploadDecisionError, match=f"{upload_id!r} was aborted on this party"):
        await store.commit("ds", upload_id)
    with pytest.raises(NotFoundError):
        store.upload(upload_id)
    assert upload_id not in {u.manifest.upload_id for u in store.held_uploads("ds")}
    assert upload_id not in {u.manifest.upload_id for u, _ in store.listing("ds")}
    with pytest.raises(UploadReplayedError, match="aborted"):
        await put_part(store, party.sealed(upload_id))
    assert store.status(upload_id) == "aborted"
    assert not (party.state / "uploads" / upload_id).exists()


def _crash_in(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise SimulatedCrash(name)

    monkeypatch.setattr(target, name, crash)


def test_crash_between_tombstone_and_deletion_then_restart(
    party: StoreParty, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        first = party.store()
        await put_part(first, party.sealed("u1"))
        _crash_in(monkeypatch, ShareStore, "_discard")  # the tombstone is written, then stop
        with pytest.raises(SimulatedCrash):
            await first.abort("ds", "u1")
        monkeypatch.undo()
        # what the crash leaves: the tombstone and the whole staged part
        assert (party.state / "aborted" / "u1").is_file()
        assert (party.staged_dir("u1") / "manifest.json").is_file()

        again = party.store()  # the restart
        assert not party.staged_dir("u1").exists()  # deleted on start, never indexed
        await _assert_never_usable(again, party, "u1")
        assert await again.abort("ds", "u1") == "aborted"  # the gateway's retry: idempotent

    asyncio.run(scenario())


def test_crash_in_the_middle_of_the_deletion_then_restart(
    party: StoreParty, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        first = party.store()
        await put_part(first, party.sealed("u1"))
        _crash_in(monkeypatch, store_module.shutil, "rmtree")  # after the rename to a dot-name
        with pytest.raises(SimulatedCrash):
            await first.abort("ds", "u1")
        monkeypatch.undo()
        leftovers = [p.name for p in (party.state / "staged").iterdir()]
        assert len(leftovers) == 1 and leftovers[0].startswith(".aborted-")

        again = party.store()
        assert list((party.state / "staged").iterdir()) == []
        await _assert_never_usable(again, party, "u1")

    asyncio.run(scenario())


@pytest.mark.parametrize("removed", ["manifest.json", "labels.shr", "data.shr"])
def test_partly_deleted_staged_part_under_a_tombstone_is_cleared(
    party: StoreParty, removed: str
) -> None:
    # an abort cut short in the middle of deleting the directory in place (as an older
    # version did): whatever files are left, the directory is deleted on start
    async def scenario() -> None:
        first = party.store()
        await put_part(first, party.sealed("u1"))
        (party.state / "aborted" / "u1").write_bytes(b"ds")
        (party.staged_dir("u1") / removed).unlink()

        again = party.store()
        assert not party.staged_dir("u1").exists()
        await _assert_never_usable(again, party, "u1")

    asyncio.run(scenario())


def test_aborted_upload_committed_by_an_older_version_is_not_used(party: StoreParty) -> None:
    # the state the gap left: after a restart an older version committed the staged part
    # of an aborted upload; now the tombstone wins and no job gets it
    async def scenario() -> None:
        first = party.store()
        await put_part(first, party.sealed("u1"))
        await put_part(first, party.sealed("u2"))
        await first.commit("ds", "u2")
        (party.state / "aborted" / "u1").write_bytes(b"ds")
        shutil.move(party.staged_dir("u1"), party.state / "uploads" / "u1")

        again = party.store()
        assert again.status("u1") == "aborted"
        with pytest.raises(UploadDecisionError, match="was aborted"):
            await again.commit("ds", "u1")
        with pytest.raises(NotFoundError):
            again.upload("u1")
        assert [u.manifest.upload_id for u in again.held_uploads("ds")] == ["u2"]
        assert [u.manifest.upload_id for u, _ in again.listing("ds")] == ["u2"]

    asyncio.run(scenario())


def test_tombstone_write_failing_midway_refuses_the_id_until_the_retry(
    party: StoreParty, monkeypatch: pytest.MonkeyPatch
) -> None:
    # write_durable fails after the rename (fsync of the directory): the tombstone may
    # be on disk, so a commit in this process must not go through either
    real = store_module.write_durable

    def half_written(path: Path, data: bytes) -> None:
        real(path, data)
        raise OSError(5, "Input/output error")

    async def scenario() -> None:
        store = party.store()
        await put_part(store, party.sealed("u1"))
        monkeypatch.setattr(store_module, "write_durable", half_written)
        with pytest.raises(StorageError, match="input/output error"):
            await store.abort("ds", "u1")
        monkeypatch.undo()
        with pytest.raises(UploadDecisionError, match="was aborted"):
            await store.commit("ds", "u1")
        assert store.held_uploads("ds") == []
        assert store.status("u1") == "staged"  # the part is still there: the gateway retries
        assert await store.abort("ds", "u1") == "aborted"
        assert not party.staged_dir("u1").exists()
        await _assert_never_usable(party.store(), party, "u1")

    asyncio.run(scenario())


def test_commit_then_abort_and_abort_then_commit(party: StoreParty) -> None:
    async def scenario() -> None:
        store = party.store()
        await put_part(store, party.sealed("c1"))
        await put_part(store, party.sealed("a1"))
        assert await store.commit("ds", "c1") == "committed"
        with pytest.raises(UploadDecisionError, match="is committed"):
            await store.abort("ds", "c1")
        assert await store.abort("ds", "a1") == "aborted"
        with pytest.raises(UploadDecisionError, match="was aborted"):
            await store.commit("ds", "a1")
        again = party.store()
        assert again.status("c1") == "committed" and again.status("a1") == "aborted"
        assert [u.manifest.upload_id for u in again.held_uploads("ds")] == ["c1"]
        assert await again.commit("ds", "c1") == "committed"  # still idempotent
        await _assert_never_usable(again, party, "a1")

    asyncio.run(scenario())


@pytest.mark.parametrize("abort_first", [True, False])
def test_commit_racing_abort_leaves_one_decision_that_a_restart_keeps(
    party: StoreParty, abort_first: bool
) -> None:
    async def scenario() -> None:
        store = party.store()
        await put_part(store, party.sealed("u1"))
        calls = [store.abort("ds", "u1"), store.commit("ds", "u1")]
        results = await asyncio.gather(*(calls if abort_first else calls[::-1]),
                                       return_exceptions=True)
        outcome = {r if isinstance(r, str) else type(r).__name__ for r in results}
        assert outcome == {"aborted" if abort_first else "committed", "UploadDecisionError"}
        decided = "aborted" if abort_first else "committed"
        again = party.store()
        assert store.status("u1") == again.status("u1") == decided
        held = [u.manifest.upload_id for u in again.held_uploads("ds")]
        assert held == ([] if abort_first else ["u1"])
        assert (party.state / "aborted" / "u1").exists() == abort_first
        assert list((party.state / "staged").iterdir()) == []

    asyncio.run(scenario())


def test_leftover_tombstone_temp_file_is_cleared(party: StoreParty) -> None:
    (party.state / "aborted").mkdir(mode=0o700)
    tmp = party.state / "aborted" / ".u1.0123.tmp"  # a tombstone write cut short
    tmp.write_bytes(b"ds")
    store = party.store()
    assert not tmp.exists() and store.status("u1") == "absent"


# ------------------------------------------------------------ a real daemon and a job

Stub = party_pb2_grpc.PartyServiceStub


def _staged_messages(up: SealedUpload, party: int) -> Iterator[party_pb2.UploadPartChunk]:
    for msg in upload_messages(up, party):
        if msg.WhichOneof("part") == "header":
            msg.header.staged = True
        yield msg


@pytest.mark.parametrize("crash", ["deletion-raises", "state-rebuilt"])
def test_daemon_crashed_mid_abort_never_commits_or_runs_a_job_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    owner = dep.add_owner("owner-a")
    recipient = dep.add_owner("recipient")

    async def scenario() -> None:
        servers = [await start_party_server(s) for s in dep.settings]
        channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
        try:
            stubs = [Stub(c) for c in channels]
            box = [i.box_public_key for i in await identities(stubs)]
            up = _upload(owner, box, "u1")
            mask = mask_upload(recipient, box, np.zeros((1, 2), dtype=np.uint64),
                               dataset_id="m", upload_id="m1")
            for i, stub in enumerate(stubs):
                await stub.PutUploadPart(_staged_messages(up, i))
                await stub.PutUploadPart(upload_messages(mask, i))

            # Alice stops between writing the tombstone and deleting the staged part
            state = dep.settings[0].state_dir
            if crash == "deletion-raises":
                _crash_in(monkeypatch, servers[0].state.store, "_discard")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stubs[0].AbortUpload(
                        party_pb2.UploadDecisionRequest(dataset_id="ds", upload_id="u1"))
                assert info.value.code() == grpc.StatusCode.INTERNAL
            await servers[0].stop(0)
            await channels[0].close()
            if crash == "state-rebuilt":  # the same state, laid out by hand
                (state / "aborted").mkdir(exist_ok=True)
                (state / "aborted" / "u1").write_bytes(b"ds")
            assert (state / "aborted" / "u1").is_file() and (state / "staged" / "u1").is_dir()

            servers[0] = await start_party_server(dep.settings[0])  # the restart
            channels[0] = dep.channel(0, servers[0].port)
            stubs[0] = Stub(channels[0])
            assert not (state / "staged" / "u1").exists()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stubs[0].CommitUpload(
                    party_pb2.UploadDecisionRequest(dataset_id="ds", upload_id="u1"))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "'u1' was aborted on this party" in (info.value.details() or "")
            listed = await stubs[0].ListUploads(party_pb2.ListUploadsRequest(dataset_id="ds"))
            assert list(listed.uploads) == []
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stubs[0].GetDataset(party_pb2.GetDatasetRequest(dataset_id="ds"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND

            # the others committed (say the gateway's decision raced): a job pinned to
            # the upload is still refused by Alice, naming the upload
            for stub in stubs[1:]:
                await stub.CommitUpload(
                    party_pb2.UploadDecisionRequest(dataset_id="ds", upload_id="u1"))
            desc = describe_job(
                "j1", [[up]], mask=mask, k=1, security="passive-3pc", engine="mpyc",
                recipient_public_key=bytes(recipient.box.public_key),
                peers=dep.peer_addresses(),
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stubs[0].StartJob(start_requests(desc))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "Alice does not hold upload 'u1'" in (info.value.details() or "")
            assert not servers[0].state.jobs._records
        finally:
            for c in channels:
                await c.close()
            for srv in servers:
                await srv.stop(0)

    asyncio.run(scenario())
