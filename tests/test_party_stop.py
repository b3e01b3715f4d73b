"""A party stopped (or a job cancelled) while a finished run's result is being kept keeps
it: the cancel waits the few milliseconds that take, and the job's record says succeeded,
its opened words on disk, instead of a run lost at its very end."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from ppfs_party import jobs as party_jobs
from ppfs_party.jobs import JobRecord, JobRunner, finish_despite_cancel

from ppfs.durable import write_durable
from ppfs.engines.base import PartyRunResult


class _Audit:
    def __init__(self) -> None:
        self.events: list[str] = []

    def record(self, event: str, **fields: Any) -> None:
        self.events.append(event)


def test_a_cancel_waits_for_a_finished_run_to_be_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = SimpleNamespace(state_dir=tmp_path, max_concurrent_jobs=1)
    audit = _Audit()
    runner = JobRunner(settings, None, None, audit, {})  # type: ignore[arg-type]
    runner.open()
    rec = JobRecord(job_id="j", description_hex="", description_sha256="",
                    engine="mp-spdz", security="passive-3pc", state="running")
    runner._records["j"] = rec
    job_dir = tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)
    result = PartyRunResult(party=0, opened=np.arange(5, dtype=np.uint64), seconds=1.0,
                            bytes_sent=10, exit_code=0, program_hash="0" * 64)
    writing, release = threading.Event(), threading.Event()

    def slow_write(path: Path, data: bytes) -> None:
        writing.set()
        release.wait(10)
        write_durable(path, data)

    monkeypatch.setattr(party_jobs, "write_durable", slow_write)

    async def main() -> None:
        task = asyncio.create_task(finish_despite_cancel(runner._succeed(rec, job_dir, result)))
        await asyncio.to_thread(writing.wait, 10)
        task.cancel()                       # the party stops while the result is kept
        await asyncio.sleep(0.2)
        assert not task.done()              # the cancel waits for it
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task                      # and is raised once the result is kept

    asyncio.run(main())
    assert rec.state == "succeeded"
    on_disk = json.loads((tmp_path / "jobs" / "j.json").read_text())
    assert on_disk["state"] == "succeeded"
    words = np.frombuffer((job_dir / "opened.u64").read_bytes(), dtype="<u8")
    assert words.tolist() == [0, 1, 2, 3, 4]
    assert audit.events == ["job.succeeded"]


def test_without_a_cancel_the_step_runs_as_it_is() -> None:
    async def main() -> list[str]:
        done: list[str] = []

        async def step() -> None:
            await asyncio.sleep(0)
            done.append("kept")

        await finish_despite_cancel(step())
        return done

    assert asyncio.run(main()) == ["kept"]
