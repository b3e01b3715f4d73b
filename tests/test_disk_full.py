"""A party's disk fills up (or a write fails) while it stores an upload part, keeps a
job's result or records a job's state: the error names the problem (this party's disk
is full; never "Internal server error." nor a peer), nothing half-written is taken as
valid, the upload is aborted everywhere or the job ends failed with every watcher told,
and once space is back the same steps succeed. The full disk is played by making a
write raise ``OSError(ENOSPC)`` (or ``EIO``) in the process."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey
from party_harness import Owner, SealedUpload, data_upload
from ppfs_party import jobs as party_jobs
from ppfs_party.audit import AuditLog
from ppfs_party.errors import DiskFullError, JobConflictError, StorageError, to_status
from ppfs_party.jobs import JobRecord, JobRunner
from ppfs_party.store import ShareStore, UploadHeader, register_owner

from ppfs.engines.base import PartyRunResult
from ppfs.step2a import Security, Step2AShape

COLS = ["a", "b", "c"]
ROWS = 6


def _full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# ------------------------------------------------------------------ upload parts


def _sealed(owner: Owner, box: PrivateKey, upload_id: str) -> SealedUpload:
    others = [bytes(PrivateKey.generate().public_key) for _ in range(2)]
    raw = np.random.default_rng(5).integers(-1000, 1000, size=(ROWS, 3))  # test data
    onehot = (np.arange(ROWS) % 2).reshape(ROWS, 1)
    return data_upload(owner, [bytes(box.public_key), *others], raw, COLS, [0, 0, 0],
                       dataset_id="ds", upload_id=upload_id, onehot=onehot,
                       label_column="y", classes=("0", "1"))


async def _put(store: ShareStore, up: SealedUpload) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield up.parts[0]

    await store.put(UploadHeader(up.dataset_id, up.upload_id, up.owner_id, up.manifest,
                                 up.signature, len(up.parts[0]), True), chunks())


def test_full_disk_storing_an_upload_part_is_named_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = Owner("owner-a", SigningKey.generate())
    register_owner(tmp_path, owner.owner_id, bytes(owner.key.verify_key))
    box = PrivateKey.generate()
    up = _sealed(owner, box, "u1")

    def store() -> ShareStore:
        s = ShareStore(tmp_path, 0, box, AuditLog(tmp_path / "audit.log"), 1 << 20)
        s.open()
        return s

    async def scenario() -> None:
        first = store()
        written: list[str] = []
        real_fsync = os.fsync

        def fsync_then_full(fd: int) -> None:  # the first file is written, the next not
            written.append("f")
            if len(written) > 1:
                _full()
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync_then_full)
        with pytest.raises(DiskFullError) as err:
            await _put(first, up)
        monkeypatch.undo()
        code, message = to_status(err.value)
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "disk is full" in message and "storing the upload part" in message
        assert "Internal server error" not in message and str(tmp_path) not in message
        # nothing half-written is kept or used, now or after a restart
        assert first.status("u1") == "absent"
        for where in ("uploads", "staged"):
            assert list((tmp_path / where).iterdir()) == []
        assert store().status("u1") == "absent"
        # space is back: the gateway's abort of the id, or a new upload, both go through
        again = store()
        await _put(again, _sealed(owner, box, "u2"))
        assert again.status("u2") == "staged"
        assert await again.abort("ds", "u1") == "aborted"

    asyncio.run(scenario())


def test_failed_write_of_an_abort_names_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ShareStore(tmp_path, 0, PrivateKey.generate(), AuditLog(tmp_path / "audit.log"),
                       1 << 20)
    store.open()

    def io_error(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr("ppfs_party.store.write_durable", io_error)
    with pytest.raises(StorageError) as err:
        asyncio.run(store.abort("ds", "u9"))
    code, message = to_status(err.value)
    assert code is grpc.StatusCode.INTERNAL
    assert "input/output error" in message and "abort" in message
    assert store.status("u9") == "aborted"  # its tombstone may be on disk: refused


def _io_error(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize(("fault", "status", "named"), [
    (_full, 422, "Bob refused the upload: this party's disk is full"),
    (_io_error, 502, "Bob failed the upload: this party could not write its files "
                     "(input/output error)"),
], ids=["disk full", "I/O error"])
def test_full_party_disk_aborts_the_upload_everywhere_naming_the_party(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: Any, status: int, named: str
) -> None:
    from ppfs_client.sdk import ApiError
    from service_fakes import RealCluster, make_stack, owner_table

    from ppfs.synthetic import make_table

    cluster = RealCluster(3, tmp_path, engines=("mpyc",))
    s = make_stack(tmp_path, cluster=cluster)
    try:
        a = s.client("owner-a")
        ds = a.create_dataset("study")["id"]
        t = make_table(12, 3, seed=7)
        bob = cluster.servers[1].state.store
        monkeypatch.setattr(bob, "_commit", fault)
        with pytest.raises(ApiError) as err:
            a.upload_table(s.keys["owner-a"], owner_table(t), ds)
        assert err.value.status == status, err.value
        detail = err.value.detail
        assert named in detail and "not added" in detail and "did not answer" not in detail
        assert "Alice" not in detail and "Carol" not in detail
        assert a.get_dataset(ds)["rows"] == 0
        for i in range(3):  # no party keeps a part of it, staged or committed
            st = cluster.servers[i].state.store
            assert st.held_uploads(ds) == [] and st.listing(ds) == []
            assert not any((cluster.dep.settings[i].state_dir / "staged").iterdir())
        monkeypatch.undo()  # space is back
        a.upload_table(s.keys["owner-a"], owner_table(t), ds)
        assert a.get_dataset(ds)["rows"] == 12
        assert a.check_dataset(ds)["consistent"]
    finally:
        s.close()


# ------------------------------------------------------------------ job results and records


class _Audit:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def record(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


class _Engine:
    name = "fake"

    async def run_party(self, spec: Any, progress: Any) -> PartyRunResult:
        return PartyRunResult(party=0, opened=np.arange(4, dtype=np.uint64), seconds=0.1,
                              bytes_sent=1, exit_code=0, program_hash="0" * 64)


def _runner(state: Path, audit: _Audit) -> JobRunner:
    settings = SimpleNamespace(
        state_dir=state, max_concurrent_jobs=1, index=0, name="Alice", mpc_bind_host=None,
        job_timeout=None, stall_timeout=None, dial_for=lambda peers: None)
    keys = SimpleNamespace(mpc_key=lambda e: state / "k", mpc_cert=lambda e: state / "c",
                           ca_path=state / "ca")
    runner = JobRunner(settings, keys, None, audit, {})
    runner.open()
    return runner


def _job() -> Any:
    shape = Step2AShape(m=4, p=2, n_classes=2, k=1)
    return SimpleNamespace(engine="fake", shape=shape, security=Security.PASSIVE_3PC,
                           peer_mpc_addresses=["127.0.0.1:1"] * 3,
                           session_tag=lambda digest: 1)


async def _run_to_end(runner: JobRunner, rec: JobRecord) -> list[str]:
    """Run the job as the daemon does; every state a watcher saw, to the last."""
    seen: list[str] = []

    async def watch() -> None:
        async for r in runner.watch(rec.job_id):
            seen.append(r.state)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    await runner._run(rec, _job(), _Engine())
    await asyncio.wait_for(watcher, 5)  # a watcher is told the job's end
    return seen


@pytest.mark.parametrize("full", ["result", "result and record"])
def test_full_disk_keeping_a_result_fails_the_job_naming_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full: str
) -> None:
    audit = _Audit()
    runner = _runner(tmp_path, audit)
    rec = JobRecord(job_id="j", description_hex="", description_sha256="", engine="fake",
                    security="passive-3pc", state="queued")
    runner._records["j"] = rec
    runner._save(rec)

    async def compiled(*args: object) -> str:
        return "0" * 64

    monkeypatch.setattr(runner, "_compile", compiled)
    monkeypatch.setattr(party_jobs, "assemble", lambda *a: SimpleNamespace(
        shape=_job().shape, bundles=[]))
    real_write = party_jobs.write_durable

    def write(path: Path, data: bytes) -> None:
        if path.name == "opened.u64" or (full == "result and record" and rec.state != "queued"
                                         and rec.state != "running"):
            _full()
        real_write(path, data)

    monkeypatch.setattr(party_jobs, "write_durable", write)
    # the record is written through JobRunner._save, which uses write_durable too
    seen = asyncio.run(_run_to_end(runner, rec))

    assert seen[-1] == "failed" and "succeeded" not in seen
    assert rec.state == "failed" and rec.failure == "own"
    assert "disk is full" in rec.error and "keeping the job's result" in rec.error
    assert not (tmp_path / "jobs" / "j" / "opened.u64").exists()
    with pytest.raises(JobConflictError, match="no result"):
        runner.result_part("j")
    failed = [f for e, f in audit.events if e == "job.failed"]
    assert len(failed) == 1 and "disk is full" in failed[0]["reason"]
    on_disk = json.loads((tmp_path / "jobs" / "j.json").read_text())
    if full == "result":
        assert on_disk["state"] == "failed" and "disk is full" in on_disk["error"]
    else:  # the failure could not be written either: a restart finds it unfinished
        assert on_disk["state"] == "running"
    monkeypatch.undo()  # space is back: a restart keeps (or records) the job failed
    again = _runner(tmp_path, _Audit())
    assert again.get("j").state == "failed"
    with pytest.raises(JobConflictError, match="no result"):
        again.result_part("j")


# ------------------------------------------------------------------ the audit log


def test_an_audit_line_the_disk_takes_part_of_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit = AuditLog(tmp_path / "audit.log")
    audit.record("upload.accepted", upload_id="u1")
    real_write = os.write

    def half(fd: int, data: bytes) -> int:  # the disk fills in the middle of the line
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError, match="No space left"):
        audit.record("job.accepted", job_id="j1")
    monkeypatch.undo()
    assert [e["event"] for e in audit.entries()] == ["upload.accepted"]
    audit.record("job.failed", job_id="j1")  # space is back: the log goes on, whole
    assert [e["event"] for e in audit.entries()] == ["upload.accepted", "job.failed"]
