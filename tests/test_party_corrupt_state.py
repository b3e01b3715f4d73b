"""A party's job record truncated or corrupted on disk (a disk fault, a bad restore): the
daemon refuses to start, naming the file, in one line (exit 2), instead of starting
without it. Skipped, the record's job would be forgotten, and with it what the record
enforces: its mask upload serves no second job, and its consent uses are counted."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from ppfs_cli.main import main
from ppfs_party.errors import CorruptStateError
from ppfs_party.jobs import JobRecord, JobRunner


def _runner(state: Path) -> JobRunner:
    settings = SimpleNamespace(state_dir=state, max_concurrent_jobs=1)
    runner = JobRunner(settings, None, None, SimpleNamespace(record=lambda *a, **k: None),
                       {})
    runner.open()
    return runner


def _record(state: Path) -> bytes:
    """A finished job's record on disk, as the party writes it; its bytes."""
    rec = JobRecord(job_id="j1", description_hex="", description_sha256="",
                    engine="mp-spdz", security="passive-3pc", state="succeeded",
                    mask_upload_id="masks-1", spent_consents=["c" * 64])
    runner = _runner(state)
    runner._save(rec)
    path = state / "jobs" / "j1.json"
    assert json.loads(path.read_text())["mask_upload_id"] == "masks-1"
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "not a record"])
def test_a_damaged_job_record_stops_the_start_naming_it(tmp_path: Path, damage: str) -> None:
    whole = _record(tmp_path)
    path = tmp_path / "jobs" / "j1.json"
    path.write_bytes({
        "truncated": whole[: len(whole) // 2],
        "zeroed": bytes(len(whole)),  # what a crash on some file systems leaves
        "not a record": json.dumps({"job": "j1"}).encode(),
    }[damage])
    with pytest.raises(CorruptStateError, match=r"job record .*jobs/j1\.json cannot be read"):
        _runner(tmp_path)
    assert path.exists()  # left for the operator, not rewritten or removed
    path.write_bytes(whole)  # restored: the job, its mask and consent uses are back
    runner = _runner(tmp_path)
    rec = runner.get("j1")
    assert rec.mask_upload_id == "masks-1" and rec.spent_consents == ["c" * 64]
    assert asdict(rec) == json.loads(whole)


def test_party_init_on_a_damaged_record_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "alice"
    assert main(["party", "init", "--state-dir", str(state), "--index", "0"]) == 0
    whole = _record(state)
    (state / "jobs" / "j1.json").write_bytes(whole[:10])
    capsys.readouterr()
    assert main(["party", "init", "--state-dir", str(state), "--index", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ppfs party init: error:"), err
    assert "jobs/j1.json" in err and "restore it" in err and "Traceback" not in err


def test_an_upload_whose_manifest_is_damaged_is_set_aside_for_its_repair(
    tmp_path: Path,
) -> None:
    """Its directory is moved to ``damaged/`` (named in the log and the audit log), not
    left under its id: the owner's repair then stores the part again."""
    import asyncio
    from collections.abc import AsyncIterator

    import numpy as np
    from nacl.public import PrivateKey
    from nacl.signing import SigningKey
    from party_harness import Owner, data_upload
    from ppfs_party.audit import AuditLog
    from ppfs_party.store import ShareStore, UploadHeader, register_owner

    owner = Owner("owner-a", SigningKey.generate())
    register_owner(tmp_path, owner.owner_id, bytes(owner.key.verify_key))
    box = PrivateKey.generate()
    others = [bytes(PrivateKey.generate().public_key) for _ in range(2)]
    raw = np.random.default_rng(5).integers(-1000, 1000, size=(6, 3))  # test data
    up = data_upload(owner, [bytes(box.public_key), *others], raw, ["a", "b", "c"],
                     [0, 0, 0], dataset_id="ds", upload_id="u1",
                     onehot=(np.arange(6) % 2).reshape(6, 1), label_column="y",
                     classes=("0", "1"))
    audit = AuditLog(tmp_path / "audit.log")

    def store() -> ShareStore:
        s = ShareStore(tmp_path, 0, box, audit, 1 << 20)
        s.open()
        return s

    async def put_and_commit(s: ShareStore) -> None:
        async def chunks() -> AsyncIterator[bytes]:
            yield up.parts[0]

        await s.put(UploadHeader("ds", "u1", owner.owner_id, up.manifest, up.signature,
                                 len(up.parts[0]), True), chunks())
        await s.commit("ds", "u1")

    asyncio.run(put_and_commit(store()))
    manifest = tmp_path / "uploads" / "u1" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:20])  # a disk fault

    again = store()
    assert again.status("u1") == "absent"
    assert not (tmp_path / "uploads" / "u1").exists()
    kept = list((tmp_path / "damaged").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("uploads-u1-")
    assert (kept[0] / "data.shr").is_file()  # for the operator, as it was
    assert [e["event"] for e in audit.entries()][-1] == "upload.damaged"
    asyncio.run(put_and_commit(again))  # the owner's repair
    assert [u.manifest.upload_id for u in store().held_uploads("ds")] == ["u1"]


def test_a_damaged_owners_registry_stops_the_start_and_is_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``owners.json`` truncated: the party does not start (it would refuse every upload
    with an internal error), and ``add-owner`` does not write a new one over it (which
    would drop every other owner's key): one line each, naming the file."""
    state = tmp_path / "alice"
    assert main(["party", "init", "--state-dir", str(state), "--index", "0"]) == 0
    key = "ab" * 32
    for owner in ("owner-a", "owner-b"):
        assert main(["party", "add-owner", "--state-dir", str(state), "--owner-id", owner,
                     "--public-key", key]) == 0
    owners = state / "owners.json"
    whole = owners.read_bytes()
    owners.write_bytes(whole[: len(whole) // 2])
    capsys.readouterr()
    for argv in (["party", "init", "--state-dir", str(state), "--index", "0"],
                 ["party", "add-owner", "--state-dir", str(state), "--owner-id", "owner-c",
                  "--public-key", key]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "owners.json cannot be read" in err, err
        assert "Traceback" not in err
    assert owners.read_bytes() == whole[: len(whole) // 2]  # left for the operator
    owners.write_bytes(whole)  # restored: both owners are back
    assert main(["party", "init", "--state-dir", str(state), "--index", "0"]) == 0
    assert set(json.loads(owners.read_text())) == {"owner-a", "owner-b"}
