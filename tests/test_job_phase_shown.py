"""While a party compiles a job's program the job is queued there; `ppfs jobs show`
and `ppfs jobs watch` say so ("Alice: queued 1% (compiling)") rather than a bare
"queued" that reads as a job nobody works on. The phase travels from the party's job
record through the gateway to the client as it is."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from party_harness import SlowEngine
from ppfs_party import state as party_state
from service_fakes import RealCluster, horizontal_setup, make_stack, run_cli, wait_final

from ppfs.engines.base import Engine
from ppfs.engines.mpyc_engine import MpycEngine

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")


def test_a_compiling_party_is_shown_as_queued_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def usable(settings: Any) -> dict[str, Engine]:
        return {"mpyc": SlowEngine(MpycEngine(), seconds=4.0)}  # type: ignore[dict-item]

    monkeypatch.setattr(party_state, "usable_engines", usable)
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",)))
    try:
        _, ids, _ = horizontal_setup(s, m=20, p=4)
        box = s.keys["analyst-1"].box_public_key
        for owner, ds in zip(("owner-a", "owner-b"), ids, strict=True):
            s.client(owner).consent(s.keys[owner], ds, "analyst-1", box)
        analyst = s.client("analyst-1")
        job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2, engine="mpyc")
        deadline = time.monotonic() + 30
        while analyst.get_job(job["id"])["parties"][0]["phase"] != "compiling":
            assert time.monotonic() < deadline, analyst.get_job(job["id"])
            time.sleep(0.05)
        rc, out, err = run_cli(capsys, s, "analyst-1", "jobs", "show", job["id"])
        assert rc == 0, err
        assert "Alice: queued 1% (compiling)" in out, out
        rc, out, err = run_cli(capsys, s, "analyst-1", "jobs", "watch", job["id"])
        assert rc == 0, err
        lines = out.splitlines()
        assert "Alice: queued 1% (compiling)" in lines[0], lines
        assert lines[-1] == f"next: ppfs result fetch {job['id']}", lines
        assert wait_final(analyst, job["id"])["state"] == "succeeded"
    finally:
        s.close()


def test_a_phase_that_repeats_the_state_is_not_repeated() -> None:
    from ppfs_client.commands import _job_line

    job = {"id": "J1", "state": "queued", "error": "", "k": 2, "m": 20, "p": 4,
           "security": "passive-3pc", "engine": "mpyc",
           "parties": [{"index": 0, "name": "Alice", "state": "queued", "phase": "queued",
                        "progress": 0.0},
                       {"index": 1, "name": "Bob", "state": "succeeded", "phase": "done",
                        "progress": 1.0}]}
    assert _job_line(job).splitlines()[1] == "  Alice: queued 0%  Bob: succeeded 100%"
