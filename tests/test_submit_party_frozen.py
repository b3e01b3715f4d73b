"""A party daemon that is frozen (SIGSTOP: its process and its port are there, the kernel
accepts connections, but it never answers) is named within seconds, not after minutes
of silence: `ppfs jobs submit` refuses the job naming the party and saying that nothing
was submitted, and a job whose party freezes while it runs fails naming that party.

The parties are real daemons (``python -m ppfs_party serve``, MPyC), each its own
process, so that one of them can be stopped with a signal; every stopped daemon is
continued in a ``finally``, so none is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_fakes import (
    DaemonCluster,
    FakeCluster,
    FakeParty,
    Stack,
    horizontal_setup,
    make_stack,
    run_cli,
    wait_final,
)

from ppfs.v1 import party_pb2 as pb

# the gateway's default: a call a party answers at once (its identity, what it holds,
# starting a job) waits at most this long
ANSWER_SECONDS = 5.0
# a frozen party was found only by gRPC keepalive (60 s + 20 s) or the upload's deadline
# (120 s) before; bounded well below that and well above the 5 s on a loaded machine
BOUND = 30.0


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path, cluster=DaemonCluster(3, tmp_path, engines=("mpyc",)))
    yield s
    s.close()


@contextlib.contextmanager
def frozen(s: Stack, index: int) -> Iterator[None]:
    pid = s.cluster.servers[index].proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_submit_to_a_frozen_party_names_it_within_seconds(daemons: Stack,
                                                          capsys: Any) -> None:
    s = daemons
    _, ids, _ = horizontal_setup(s, m=20, p=4)
    analyst = s.client("analyst-1")
    analyst.deployment()  # the gateway knows every party before one freezes
    masks_before = analyst.list_datasets("mask")
    with frozen(s, 1):
        t0 = time.monotonic()
        rc, out, err = run_cli(capsys, s, "analyst-1", "jobs", "submit", "--dataset", ids[0],
                               "--dataset", ids[1], "--label", "label", "--k", "2",
                               "--engine", "mpyc")
        took = time.monotonic() - t0
        lines = err.strip().splitlines()
        assert rc == 1 and out == "", (rc, out, err)
        assert lines[-1].startswith("ppfs: error: "), lines
        assert (f"Bob did not answer ListUploads within {ANSWER_SECONDS:g} s "
                "(frozen or overloaded?)") in lines[-1], lines
        assert "no job was submitted" in lines[-1], lines
        assert took < BOUND, f"the submit took {took:.0f} s"
        # nothing was left: no job, no mask data set waiting for an upload
        assert analyst.list_jobs() == []
        assert analyst.list_datasets("mask") == masks_before


def test_a_party_frozen_while_the_job_runs_is_named_by_jobs_watch(tmp_path: Path,
                                                                  capsys: Any) -> None:
    # lost after 8 s of silence (polls every 1.3 s, each waiting at most 2 s): the watch
    # shows the silence at the first unanswered poll, then the job fails naming Bob
    s = make_stack(tmp_path, cluster=DaemonCluster(3, tmp_path, engines=("mpyc",)),
                   party_lost_seconds=8.0)
    try:
        _, ids, _ = horizontal_setup(s, m=20, p=4)
        box = s.keys["analyst-1"].box_public_key
        for owner, ds in zip(("owner-a", "owner-b"), ids, strict=True):  # real parties check
            s.client(owner).consent(s.keys[owner], ds, "analyst-1", box)
        analyst = s.client("analyst-1")
        job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2, engine="mpyc")
        deadline = time.monotonic() + 60
        while analyst.get_job(job["id"])["parties"][1]["state"] != "running":
            assert time.monotonic() < deadline, analyst.get_job(job["id"])
            time.sleep(0.02)
        with frozen(s, 1):
            t0 = time.monotonic()
            rc, out, err = run_cli(capsys, s, "analyst-1", "jobs", "watch", job["id"])
            took = time.monotonic() - t0
            assert rc == 1, (rc, out, err)
            assert err.strip().splitlines()[-1] == (
                f"ppfs: error: job {job['id']} failed: lost the connection to Bob"), err
            # while it waited, the watch said for whom
            waiting = [line for line in out.splitlines() if "Bob: running" in line
                       and "(no answer for " in line
                       and " s: frozen or overloaded? The job fails at 8 s of silence)" in line]
            assert waiting, out
            assert took < BOUND, f"the watch took {took:.0f} s"
    finally:
        s.close()


class SilentAtStart(FakeParty):
    """A party that answers everything but StartJob, which it never answers (it froze
    between the gateway's check and the job's start)."""

    async def StartJob(self, request: Any, context: Any) -> Any:
        await asyncio.Event().wait()


def test_a_party_silent_at_the_start_fails_the_job_naming_it(tmp_path: Path) -> None:
    cluster = FakeCluster(3, tmp_path)
    cluster.parties[1] = SilentAtStart(cluster, 1)
    s = make_stack(tmp_path, cluster=cluster)
    try:
        _, ids, _ = horizontal_setup(s, m=20, p=4)
        analyst = s.client("analyst-1")
        t0 = time.monotonic()
        job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2)
        done = wait_final(analyst, job["id"], timeout=BOUND)
        took = time.monotonic() - t0
        assert done["state"] == "failed", done
        assert done["error"] == (f"could not start: Bob did not answer StartJob within "
                                 f"{ANSWER_SECONDS:g} s (frozen or overloaded?)"), done
        assert took < BOUND
        # the parties that took the job were told to drop it: none runs it
        for i in (0, 2):
            assert cluster.parties[i].jobs[job["id"]].status.state == pb.JOB_STATE_CANCELLED, i
    finally:
        s.close()
