"""All-or-nothing uploads through the real gateway and real party daemons (mutual TLS,
port 0, MPyC): an upload one party refuses or misses is used by nobody and dropped
everywhere, a party that was down catches up with the decision, a party that lost an
upload is named by `ppfs datasets check` and by job submission, and the owner's repair
restores service. Every job result is checked against the mirror."""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import replace

import numpy as np
import pytest
from ppfs_client.sdk import ApiError, build_upload
from service_fakes import (
    Stack,
    owner_table,
    pending_decisions,
    run_cli,
    wait_final,
    wait_until,
)

from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


# the `stack` fixture (conftest.py): the real party daemons, in this process
PARTY_DAEMONS = True


def stop_party(s: Stack, i: int) -> int:
    srv = s.cluster.servers[i]
    s.loop.run(srv.stop(0))
    return int(srv.port)


def start_party(s: Stack, i: int, port: int) -> None:
    from ppfs_party.server import start_party_server

    settings = replace(s.cluster.dep.settings[i], listen=f"127.0.0.1:{port}")
    s.cluster.servers[i] = s.loop.run(start_party_server(settings))


def store(s: Stack, i: int):  # the party's share store (in this process)
    return s.cluster.servers[i].state.store


def run_job(s: Stack, dataset_id: str, t, rows: int, k: int = 1) -> None:
    """A job on the data set sees exactly ``rows`` rows, and its selection is the
    mirror's on them."""
    analyst = s.client("analyst-1")
    keys = s.keys["analyst-1"]
    job = analyst.submit(keys, [dataset_id], label="label", k=k, security="passive-3pc",
                         engine="mpyc")
    assert job["m"] == rows
    done = wait_final(analyst, job["id"], timeout=240)
    assert done["state"] == "succeeded", done
    got = analyst.fetch_result(keys, job["id"])
    exps = np.asarray(analyst.get_dataset(dataset_id)["column_exponents"])
    raw = FixedPoint().encode(t.x[:rows], exps, t.columns)
    ref = mirror(raw, t.y[:rows], Step2AShape(rows, t.p, t.n_classes, k))
    assert got.indices.tolist() == ref.selected.tolist()


def test_refused_or_missed_upload_is_used_by_nobody(stack: Stack) -> None:
    s = stack
    t = make_table(20, 3, seed=7)
    a, b, admin = s.client("owner-a"), s.client("owner-b"), s.client("admin")
    ds = a.create_dataset("study")["id"]
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, 12)), ds)
    first = a.get_dataset(ds)["upload_ids"]
    admin.grant(ds, "owner-b")
    admin.grant(ds, "analyst-1")
    a.consent(s.keys["owner-a"], ds, "analyst-1", s.keys["analyst-1"].box_public_key)
    exps = a.get_dataset(ds)["column_exponents"]
    dep = a.deployment()

    # -- Carol refuses: owner-b is not registered with her
    owners = s.cluster.dep.settings[2].state_dir / "owners.json"
    registered = json.loads(owners.read_text())
    owners.write_text(json.dumps({k: v for k, v in registered.items() if k != "owner-b"}))
    body = build_upload(s.keys["owner-b"], owner_table(t, slice(12, 20)), ds, dep,
                        exponents=exps)
    with pytest.raises(ApiError) as err:
        b.post_upload(ds, body)
    assert err.value.status == 422 and "Carol" in err.value.detail, err.value
    assert "not added" in err.value.detail
    refused = body["upload_id"]
    assert a.get_dataset(ds)["rows"] == 12
    for i in range(3):  # Alice and Bob had stored it: dropped, and its id is refused
        assert store(s, i).status(refused) in ("aborted", "absent")
        assert [u.manifest.upload_id for u in store(s, i).held_uploads(ds)] == first
        assert not any((s.cluster.dep.settings[i].state_dir / "staged").iterdir())
    assert store(s, 0).status(refused) == "aborted"
    assert pending_decisions(s) == []
    owners.write_text(json.dumps(registered))

    # -- Carol is down: nobody keeps the part; she hears of the abort when she is back
    port = stop_party(s, 2)
    body = build_upload(s.keys["owner-a"], owner_table(t, slice(12, 20)), ds, dep,
                        exponents=exps)
    missed = body["upload_id"]
    with pytest.raises(ApiError) as err:
        a.post_upload(ds, body)
    assert err.value.status == 502 and "Carol" in err.value.detail, err.value
    assert a.get_dataset(ds)["rows"] == 12
    assert [store(s, i).status(missed) for i in (0, 1)] == ["aborted", "aborted"]
    assert pending_decisions(s) == [(missed, 2, "abort")]
    check = a.check_dataset(ds)
    assert not check["consistent"] and not check["parties"][2]["reachable"]
    start_party(s, 2, port)
    wait_until(lambda: pending_decisions(s) == [])
    assert store(s, 2).status(missed) == "aborted"  # a late part would be refused
    assert a.check_dataset(ds)["consistent"]

    # -- after the party recovers, a re-upload succeeds and a job sees exactly m = 20
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(12, 20)), ds, exponents=exps,
                   deployment=dep)
    assert a.get_dataset(ds)["rows"] == 20
    check = a.check_dataset(ds)
    assert check["consistent"], check
    assert all(len(p["held"]) == 2 for p in check["parties"])
    run_job(s, ds, t, 20)


def test_lost_upload_is_named_refused_and_repaired(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    t = make_table(12, 3, seed=9)
    a, admin, analyst = s.client("owner-a"), s.client("admin"), s.client("analyst-1")
    ds = a.create_dataset("study")["id"]
    a.upload_table(s.keys["owner-a"], owner_table(t), ds)
    admin.grant(ds, "analyst-1")
    a.consent(s.keys["owner-a"], ds, "analyst-1", s.keys["analyst-1"].box_public_key)
    (upload_id,) = a.get_dataset(ds)["upload_ids"]
    run_job(s, ds, t, 12)
    jobs_before = len(analyst.list_jobs())

    # Bob loses the upload (its directory is gone when he restarts)
    port = stop_party(s, 1)
    shutil.rmtree(s.cluster.dep.settings[1].state_dir / "uploads" / upload_id)
    start_party(s, 1, port)

    rc, out, _ = run_cli(capsys, s, "owner-a", "datasets", "check", ds)
    assert rc == 1
    assert f"Bob does not hold upload '{upload_id}' of data set '{ds}'" in out, out
    assert "Alice: holds 1 of 1" in out and "Carol: holds 1 of 1" in out

    # a job refuses at once, naming the party and the upload; nothing stored, no masks
    with pytest.raises(ApiError) as err:
        analyst.submit(s.keys["analyst-1"], [ds], label="label", k=1,
                       security="passive-3pc", engine="mpyc")
    assert err.value.status == 409
    assert "Bob" in err.value.detail and upload_id in err.value.detail
    assert "ppfs datasets repair" in err.value.detail
    assert len(analyst.list_jobs()) == jobs_before
    masks_before = analyst.list_datasets(kind="mask")

    # only the upload's owner repairs, with the original part (hash-checked)
    rc, _, err_text = run_cli(capsys, s, "owner-b", "datasets", "repair", ds)
    assert rc != 0  # owner-b may not even see the data set
    rc, out, err_text = run_cli(capsys, s, "owner-a", "datasets", "repair", ds)
    assert rc == 0, err_text
    assert f"re-sent upload {upload_id} to Bob" in err_text
    assert "every party holds exactly them" in out
    assert store(s, 1).status(upload_id) == "committed"
    run_job(s, ds, t, 12)
    assert len(analyst.list_datasets(kind="mask")) == len(masks_before) + 1


def test_upgraded_registry_learns_the_signed_order_from_the_parties(stack: Stack) -> None:
    """A registry made before it kept each upload's owner-signed time (its uploads
    listed by id here, the other way round from their signed order): the gateway learns
    the times from the parties before the job, once all three state them alike, pins the
    uploads in the order every party requires, and the job sees the rows in that order."""
    s = stack
    t = make_table(20, 3, seed=8)
    a, admin = s.client("owner-a"), s.client("admin")
    ds = a.create_dataset("study")["id"]
    admin.grant(ds, "analyst-1")
    a.consent(s.keys["owner-a"], ds, "analyst-1", s.keys["analyst-1"].box_public_key)
    dep = a.deployment()
    body = build_upload(s.keys["owner-a"], owner_table(t, slice(0, 12)), ds, dep,
                        upload_id="up-z")  # signed first, its id sorts last
    a.post_upload(ds, body)
    exps = a.get_dataset(ds)["column_exponents"]
    a.post_upload(ds, build_upload(s.keys["owner-a"], owner_table(t, slice(12, 20)), ds, dep,
                                   exponents=exps, upload_id="up-a"))
    assert a.get_dataset(ds)["upload_ids"] == ["up-z", "up-a"]
    reg = s.root / "gateway" / "registry.sqlite3"
    db = sqlite3.connect(reg)
    try:
        db.execute("UPDATE uploads SET signed_at = ''")  # as an older registry has them
        db.commit()
    finally:
        db.close()
    assert a.get_dataset(ds)["upload_ids"] == ["up-a", "up-z"]
    # with Carol down, two parties' word is not enough: nothing is learnt
    port = stop_party(s, 2)
    with pytest.raises(ApiError):
        s.client("analyst-1").submit(s.keys["analyst-1"], [ds], label="label", k=1,
                                     security="passive-3pc", engine="mpyc")
    assert a.get_dataset(ds)["upload_ids"] == ["up-a", "up-z"]
    start_party(s, 2, port)
    run_job(s, ds, t, 20)
    assert a.get_dataset(ds)["upload_ids"] == ["up-z", "up-a"]
