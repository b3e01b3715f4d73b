"""A party's stored share file of an upload damaged on disk (bytes flipped in place, the
file's size and times unchanged as bit rot leaves them; or the file truncated) while the
upload's owner-signed manifest is intact. Real party daemons (gRPC, mutual TLS), the
real gateway and the client.

The party finds it when it reads the job's inputs, before its engine starts (a job's
start reads no share file, so that it is answered at once): the job fails at that party,
naming the data set, the upload and the party (and nothing of the file's contents), the
others stop it, and the damaged upload is set aside (used by no job). ``ppfs
datasets check`` reports the upload at that party as damaged with what to do, also
when no job came first; the owner's ``ppfs datasets repair`` re-sends the part and the
next job runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from service_fakes import Stack, owner_table, run_cli, wait_final

from ppfs.contract import Reveal
from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")

ROWS = 16
REASONS = {"flipped": "checksum mismatch", "truncated": "wrong length"}


# the `stack` fixture (conftest.py): the real party daemons, in this process
PARTY_DAEMONS = True


def _study(s: Stack) -> tuple[str, str]:
    """A data set of one upload, granted to the analyst with the owner's consent."""
    owner, admin = s.client("owner-a"), s.client("admin")
    ds = owner.create_dataset("study")["id"]
    owner.upload_table(s.keys["owner-a"], owner_table(make_table(ROWS, 3, seed=5)), ds)
    admin.grant(ds, "analyst-1")
    owner.consent(s.keys["owner-a"], ds, "analyst-1", s.keys["analyst-1"].box_public_key,
                  Reveal.SELECTION)
    (upload_id,) = owner.get_dataset(ds)["upload_ids"]
    return ds, upload_id


def _carol(s: Stack) -> Path:
    return s.cluster.dep.settings[2].state_dir


def _damage(path: Path, how: str) -> bytes:
    """Damage the file in place; its contents before."""
    before = path.read_bytes()
    st = os.stat(path)
    with open(path, "r+b") as fh:
        if how == "flipped":  # one bit of the last share word
            fh.seek(len(before) - 1)
            fh.write(bytes([before[-1] ^ 0x01]))
        else:
            fh.truncate(len(before) - 8)
    if how == "flipped":  # as a disk's bit rot: size and times as they were
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return before


def _submit(s: Stack, ds: str) -> dict[str, Any]:
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], [ds], label="label", k=1,
                         security="passive-3pc", engine="mpyc")
    return wait_final(analyst, job["id"], timeout=120)


def _final_everywhere(s: Stack, job_id: str) -> list[str]:
    """Each party's state of the job once every party that knows it ended it ("" where
    it was never accepted)."""
    deadline = time.monotonic() + 30
    while True:
        records = [srv.state.jobs._records.get(job_id) for srv in s.cluster.servers]
        if all(r is None or r.final for r in records) or time.monotonic() > deadline:
            return ["" if r is None else r.state for r in records]
        time.sleep(0.05)


def _check_line(out: str, party: str) -> str:
    return next(ln for ln in out.splitlines() if ln.strip().startswith(f"{party}:"))


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_a_damaged_share_file_refuses_the_job_and_repair_restores_it(
    stack: Stack, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    s = stack
    ds, upload_id = _study(s)
    carol = _carol(s)
    stored = carol / "uploads" / upload_id / "data.shr"
    _damage(stored, how)

    ended = _submit(s, ds)
    assert ended["state"] == "failed", ended
    error = ended["error"]
    assert f"Carol failed: Carol's data.shr of upload {upload_id!r} (data set " \
        f"{ds!r}) is damaged ({REASONS[how]}): set aside; its owner re-sends it (ppfs " \
        "datasets repair)" in error, error
    # failed by Carol before her engine started; the others stopped it
    states = _final_everywhere(s, ended["id"])
    assert all(st in ("cancelled", "failed") for st in states), states
    audit = [json.loads(ln) for ln in (carol / "audit.log").read_text().splitlines()]
    failed = [a for a in audit if a.get("event") == "job.failed"]
    assert failed and upload_id in str(failed[-1]), failed
    assert not any(a.get("event") == "result.released" for a in audit)
    damaged = [a for a in audit if a.get("event") == "upload.damaged"]
    assert len(damaged) == 1 and damaged[0]["upload_id"] == upload_id, damaged
    # set aside: used by no job, kept for the operator
    assert not (carol / "uploads" / upload_id).exists()
    assert len(list((carol / "damaged").iterdir())) == 1

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "check", ds)
    assert rc == 1, out + err
    line = _check_line(out, "Carol")
    assert "damaged" in line and upload_id in line and f"ppfs datasets repair {ds}" in line, out
    assert "damaged" not in _check_line(out, "Alice") + _check_line(out, "Bob"), out

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "repair", ds)
    assert rc == 0, out + err
    assert f"re-sent upload {upload_id} to Carol" in err, err
    assert s.client("owner-a").check_dataset(ds)["consistent"]

    again = _submit(s, ds)
    assert again["state"] == "succeeded", again
    assert again["m"] == ROWS


def test_datasets_check_finds_a_damaged_share_file_before_any_job(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    ds, upload_id = _study(s)
    _damage(_carol(s) / "uploads" / upload_id / "labels.shr", "flipped")

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "check", ds)
    assert rc == 1, out + err
    line = _check_line(out, "Carol")
    assert "damaged" in line and upload_id in line and f"ppfs datasets repair {ds}" in line, out
    check = s.client("owner-a").check_dataset(ds)
    carol = check["parties"][2]
    assert carol["damaged"] == [upload_id] and not carol["consistent"], carol

    # until it is repaired, the gateway refuses a job on the data set, naming it
    analyst = s.client("analyst-1")
    with pytest.raises(Exception, match="damaged") as info:
        analyst.submit(s.keys["analyst-1"], [ds], label="label", k=1,
                       security="passive-3pc", engine="mpyc")
    assert upload_id in str(info.value)

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "repair", ds)
    assert rc == 0 and f"re-sent upload {upload_id} to Carol" in err, out + err
    assert s.client("owner-a").check_dataset(ds)["consistent"]


def test_datasets_check_reads_the_disk_under_a_cached_copy(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    # a job loads Carol's files into her bundle cache; the disk copy rots afterwards. A
    # job may go on being served the copy checked when it was loaded, but `datasets
    # check` is the operator asking about the disk: it reads the file, not the cache
    s = stack
    ds, upload_id = _study(s)
    assert _submit(s, ds)["state"] == "succeeded"
    stored = _carol(s) / "uploads" / upload_id / "data.shr"
    assert s.cluster.servers[2].state.store._cache.holds(stored)
    _damage(stored, "flipped")

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "check", ds)
    assert rc == 1, out + err
    line = _check_line(out, "Carol")
    assert "damaged" in line and upload_id in line and f"ppfs datasets repair {ds}" in line, out
    # set aside, and its cached copy with it: no job is served it any more
    assert not (_carol(s) / "uploads" / upload_id).exists()
    assert not s.cluster.servers[2].state.store._cache.holds(stored)

    rc, out, err = run_cli(capsys, s, "owner-a", "datasets", "repair", ds)
    assert rc == 0 and f"re-sent upload {upload_id} to Carol" in err, out + err
    again = _submit(s, ds)
    assert again["state"] == "succeeded", again
