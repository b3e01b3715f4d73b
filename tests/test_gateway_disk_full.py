"""The gateway's disk fills up (or a write fails) while it writes its registry or spools a
request body: the client gets one 507 problem naming the gateway's disk (never a bare
"Internal Server Error"), nothing half-recorded is kept, an upload every party had
stored is aborted at every party, and once space is back the registry works again
(a failed COMMIT no longer leaves a transaction open that refused every later change).

The full disk is SQLite's own "database or disk is full" (SQLITE_FULL), raised where the
registry writes; and ``OSError(ENOSPC)`` where the gateway spools a body."""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from ppfs_client.sdk import ApiError
from ppfs_gateway.errors import GatewayStorageError
from ppfs_gateway.main import RequestGuard
from ppfs_gateway.registry import Registry
from service_fakes import Stack, horizontal_setup, make_stack, owner_table, wait_final

from ppfs.synthetic import make_table


def _sqlite_full() -> sqlite3.OperationalError:
    """A genuine SQLITE_FULL error, as SQLite raises it when the disk is full."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (x)")
    db.execute("PRAGMA max_page_count = 2")
    try:
        db.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    except sqlite3.OperationalError as exc:
        assert exc.sqlite_errorcode == sqlite3.SQLITE_FULL
        return exc
    finally:
        db.close()
    raise AssertionError("SQLite did not report a full database")


class _FullDisk:
    """The registry's connection, but for the statements that start with ``fail_on``,
    which fail as on a full disk (after running, for a COMMIT: SQLite keeps the
    transaction open when its COMMIT fails)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.fail_on: str | None = None

    def execute(self, sql: str, *args: Any) -> Any:
        if self.fail_on is not None and sql.startswith(self.fail_on):
            raise _sqlite_full()
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def _fill(registry: Registry) -> _FullDisk:
    full = _FullDisk(registry._db)
    registry._db = full
    return full


@pytest.mark.parametrize("where", ["INSERT", "COMMIT"])
def test_a_full_disk_is_named_and_the_registry_works_again(tmp_path: Path, where: str) -> None:
    registry = Registry(tmp_path / "registry.sqlite3")
    full = _fill(registry)
    full.fail_on = where
    with pytest.raises(GatewayStorageError, match="gateway's disk is full") as err:
        registry.create_dataset("d1", "study", "owner-a", "data")
    assert err.value.status == 507 and "nothing of it was kept" in str(err.value)
    assert registry.get_dataset("d1") is None  # nothing half-recorded
    full.fail_on = None  # space is back: the next change goes through
    registry.create_dataset("d2", "study", "owner-a", "data")
    assert registry.get_dataset("d2") is not None and registry.get_dataset("d1") is None
    registry.close()
    again = Registry(tmp_path / "registry.sqlite3")  # and a restart finds it so
    assert again.get_dataset("d2") is not None and again.get_dataset("d1") is None
    again.close()


def _registry(s: Stack) -> Registry:
    app: Any = s.gateway.server.config.app
    registry: Registry = app.state.resources.registry
    return registry


def test_a_full_registry_aborts_the_stored_upload_at_every_party(stack: Stack) -> None:
    s = stack
    a = s.client("owner-a")
    ds = a.create_dataset("study")["id"]
    t = make_table(12, 3, seed=7)
    full = _fill(_registry(s))
    full.fail_on = "INSERT INTO uploads"  # every party stored its part; then the disk is full
    with pytest.raises(ApiError) as err:
        a.upload_table(s.keys["owner-a"], owner_table(t), ds)
    assert err.value.status == 507, err.value
    detail = err.value.detail
    assert "gateway's disk is full" in detail and "not added" in detail
    assert "will drop" not in detail  # every party was told at once
    full.fail_on = None
    assert a.get_dataset(ds)["rows"] == 0
    for party in s.cluster.parties:  # no party keeps or uses any part of it
        assert party.staged == {} and party.uploads == {}
        assert len(party.aborted) == 1
    # space is back: the same owner's upload goes through
    a.upload_table(s.keys["owner-a"], owner_table(t), ds)
    assert a.get_dataset(ds)["rows"] == 12
    assert a.check_dataset(ds)["consistent"]
    # and a restart of the gateway aborts the unrecorded upload once more (idempotent)
    s.restart_gateway()
    assert s.client("owner-a").check_dataset(ds)["consistent"]


def test_a_body_the_gateway_cannot_spool_is_a_507_naming_its_disk(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stack

    async def full(self: RequestGuard, receive: Any, spool: Any) -> bool:
        spool.write(b"{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(RequestGuard, "_spool", full)
    r = httpx.post(f"{s.gateway.url}/v1/datasets", json={"name": "study"},
                   headers={"Authorization": f"Bearer {s.token['owner-a']}"})
    assert r.status_code == 507, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert "gateway's disk is full" in body["detail"] and s.token["owner-a"] not in r.text
    assert list((s.root / "gateway" / "spool").iterdir()) == []  # nothing kept
    monkeypatch.undo()
    assert s.client("owner-a").create_dataset("study")["id"]


def test_a_job_the_registry_cannot_record_runs_on_once_space_is_back(tmp_path: Path) -> None:
    s = make_stack(tmp_path, party_lost_seconds=3.0)  # polls every half second
    try:
        _job_runs_on_once_space_is_back(s)
    finally:
        s.loop.loop.call_soon_threadsafe(s.cluster.release.set)
        s.close()


def _job_runs_on_once_space_is_back(s: Stack) -> None:
    _, ids, _ = horizontal_setup(s)
    s.cluster.hold = True  # the parties run the job until released
    full = _fill(_registry(s))
    full.fail_on = "UPDATE jobs SET state"  # the parties started it; "running" is not kept
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2)
    deadline = time.monotonic() + 10
    while not all(job["id"] in p.jobs for p in s.cluster.parties):
        assert time.monotonic() < deadline, "the parties were not asked to run the job"
        time.sleep(0.05)
    time.sleep(0.5)  # a few rounds of failed writes
    assert analyst.get_job(job["id"])["state"] == "queued"  # what the registry holds
    full.fail_on = None  # space is back
    s.loop.loop.call_soon_threadsafe(s.cluster.release.set)
    done = wait_final(analyst, job["id"], timeout=20)
    assert done["state"] == "succeeded", done
    assert len(analyst.fetch_result(s.keys["analyst-1"], job["id"]).columns) == 2
