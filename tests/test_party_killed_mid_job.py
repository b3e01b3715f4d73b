"""A party killed outright in the middle of a job's secure computation (SIGKILL of its
daemon and its MP-SPDZ engine at once, as `docker kill` does, or a `docker stop` whose
grace is shorter than the party's drain) is the one the job's failure names, never a
survivor: each survivor's engine stops because its peer vanished, and reports that as
a symptom (peer_lost), whatever MP-SPDZ printed when the connection was cut; the gateway
then finds the party it cannot reach.

The parties are real daemons (``python -m ppfs_party serve``), each its own process, so
that one can be killed alone; the gateway runs with its default of 60 s before a silent
party is declared lost, so that a failure named within seconds comes from the
survivors' reports, not from that silence. A party frozen instead (SIGSTOP) leaves its
peers waiting: it is named once it has been silent that long."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from service_fakes import DaemonCluster, Stack, horizontal_setup, make_stack, wait_final

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
pytestmark = pytest.mark.skipif(_reason is not None,
                                reason=f"MP-SPDZ not available: {_reason}")

NAMES = ("Alice", "Bob", "Carol")
# the job must fail naming the killed party this soon after the kill: the survivors'
# engines stop at once, and the gateway's look for the cause takes seconds (a silent
# party would be declared lost only after 60 s)
BOUND = 30.0
# how far the victim's job is (its progress as the gateway shows it) when it is killed:
# its program has reached the mean-split thresholds, the bulk of the computation
INTO_THE_RUN = 0.2


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _descendants(pid: int) -> list[int]:
    kids, found, todo = _children(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _has_engine(daemon_pid: int) -> bool:
    """True while the daemon's MP-SPDZ party process runs."""
    for pid in _descendants(daemon_pid):
        with contextlib.suppress(OSError):
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            if argv0.endswith(b"-party.x"):  # not its launcher, which names it too
                return True
    return False


def _kill_party(daemon_pid: int) -> None:
    """SIGKILL the daemon and everything it started, all at once (a killed container)."""
    for pid in [daemon_pid, *_descendants(daemon_pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mpspdz-cache")  # one compile for every case


@pytest.fixture
def stack(tmp_path: Path, cache: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path, cluster=DaemonCluster(3, tmp_path, engines=("mp-spdz",),
                                                   mpspdz_cache=cache))
    yield s
    s.close()


def _submit_active_3pc(s: Stack, m: int, p: int) -> tuple[Any, dict[str, Any]]:
    """Two owners' data sets of ``m`` rows (split) and ``p`` columns, their consents, and
    an active-3PC MP-SPDZ job on them: (the analyst's client, the job)."""
    _, ids, _ = horizontal_setup(s, m=m, p=p)
    box = s.keys["analyst-1"].box_public_key
    for owner, ds in zip(("owner-a", "owner-b"), ids, strict=True):
        s.client(owner).consent(s.keys[owner], ds, "analyst-1", box)
    analyst = s.client("analyst-1")
    return analyst, analyst.submit(s.keys["analyst-1"], ids, label="label", k=2,
                                   engine="mp-spdz", security="active-3pc")


def _job_into_the_run(s: Stack, victim: int) -> tuple[str, int]:
    """Submit an active-3PC job and wait until the victim's program is in the bulk of
    its computation: (job id, the victim daemon's pid)."""
    analyst, job = _submit_active_3pc(s, m=16000, p=16)
    server = s.cluster.servers[victim]
    assert server is not None
    pid = int(server.proc.pid)
    deadline = time.monotonic() + 120  # the first case compiles the program
    while True:
        now = analyst.get_job(job["id"])
        assert now["state"] in ("queued", "running"), (
            "the run ended before the victim was stopped: make the job larger", now)
        # the victim's program reports its stages as it reaches them: past its
        # connections, its inputs and their checks, into the computation's bulk
        if now["parties"][victim]["progress"] >= INTO_THE_RUN and _has_engine(pid):
            return str(job["id"]), pid
        assert time.monotonic() < deadline, now
        time.sleep(0.01)


@pytest.mark.parametrize("victim", [0, 1, 2], ids=NAMES)
def test_a_party_killed_mid_job_is_named_never_a_survivor(stack: Stack, victim: int) -> None:
    s = stack
    job_id, pid = _job_into_the_run(s, victim)
    analyst = s.client("analyst-1")
    _kill_party(pid)
    t0 = time.monotonic()
    done = wait_final(analyst, job_id, timeout=BOUND)
    took = time.monotonic() - t0
    print(f"failed {took:.1f} s after the kill: {done['error']}; parties: "
          f"{[(p['state'], p['failure_kind'], p['error']) for p in done['parties']]}")
    assert done["state"] == "failed", done
    assert done["error"] == f"lost the connection to {NAMES[victim]}", done
    # each survivor reported the run's end as a symptom of a lost peer, not its own fault
    for i, party in enumerate(done["parties"]):
        if i != victim and party["state"] == "failed":
            assert party["failure_kind"] == "peer_lost", (NAMES[i], party)
    assert took < BOUND


def test_a_party_frozen_mid_job_is_named(tmp_path: Path, cache: Path) -> None:
    # frozen (SIGSTOP of its daemon and its engine: a paused container): its peers'
    # engines wait on it without end, so the gateway names it once it has been silent
    # for party_lost_seconds
    s = make_stack(tmp_path, cluster=DaemonCluster(3, tmp_path, engines=("mp-spdz",),
                                                   mpspdz_cache=cache),
                   party_lost_seconds=8.0)
    frozen: list[int] = []
    try:
        job_id, pid = _job_into_the_run(s, 1)
        frozen = [pid, *_descendants(pid)]
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        t0 = time.monotonic()
        done = wait_final(s.client("analyst-1"), job_id, timeout=BOUND)
        assert done["state"] == "failed", done
        assert done["error"] == "lost the connection to Bob", done
        assert time.monotonic() - t0 < BOUND
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        s.close()


def test_a_party_killed_before_the_engines_connect_is_named_before_their_time_out(
    tmp_path: Path,
) -> None:
    # killed while the job compiles (its own compile cache, so that every party compiles
    # for seconds): the others' engines then wait for it to connect, up to MP-SPDZ's
    # 60 s, and the gateway's silence limit is 60 s too; its address refusing
    # connections names it well before either
    s = make_stack(tmp_path, cluster=DaemonCluster(3, tmp_path, engines=("mp-spdz",),
                                                   mpspdz_cache=tmp_path / "cache"))
    try:
        analyst, job = _submit_active_3pc(s, m=64, p=4)
        server = s.cluster.servers[2]
        assert server is not None
        pid = int(server.proc.pid)
        deadline = time.monotonic() + 30
        while analyst.get_job(job["id"])["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not _has_engine(pid)  # still compiling: no engine has connected
        _kill_party(pid)
        t0 = time.monotonic()
        done = wait_final(analyst, job["id"], timeout=BOUND)
        assert done["state"] == "failed", done
        assert done["error"] == "lost the connection to Carol", done
        assert time.monotonic() - t0 < BOUND
    finally:
        s.close()


# the honest parties' stall limit in the case below: their engines stop once they have
# neither computed nor printed this long
STALL = 4.0


def test_a_party_whose_engine_alone_freezes_fails_the_job_blaming_nobody(
    tmp_path: Path, cache: Path,
) -> None:
    # Carol's engine freezes (SIGSTOP of its processes) while her daemon keeps answering
    # that the job runs, as a corrupted party could make it: the gateway never finds her
    # silent, and the others' engines wait on her without end (but for the run's time
    # limit, hours). Their stall watch ends the run; Carol's own is off (a corrupted
    # party would not report itself). The job fails within seconds, saying that a peer
    # stopped answering, and names no honest party as the one that failed.
    cluster = DaemonCluster(3, tmp_path, engines=("mp-spdz",), mpspdz_cache=cache,
                            stall_timeout=STALL)
    cluster.dep.settings[2] = replace(cluster.dep.settings[2], stall_timeout=0.0)
    s = make_stack(tmp_path, cluster=cluster)
    frozen: list[int] = []
    try:
        job_id, pid = _job_into_the_run(s, 2)
        frozen = _descendants(pid)  # the engine and its launcher, not the daemon
        assert frozen
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        t0 = time.monotonic()
        done = wait_final(s.client("analyst-1"), job_id, timeout=BOUND)
        took = time.monotonic() - t0
        print(f"failed {took:.1f} s after the freeze: {done['error']}; parties: "
              f"{[(p['state'], p['failure_kind'], p['error']) for p in done['parties']]}")
        assert done["state"] == "failed", done
        assert took < BOUND
        error = done["error"]
        assert "made no progress" in error and "a peer stopped answering" in error, done
        assert "no party is blamed" in error, done
        for honest in ("Alice", "Bob"):
            assert f"{honest} failed" not in error, done
        assert done["failure_kind"] == "stalled", done
        # an honest party that reports the stall names no culprit; one whose engine
        # stopped when the other's did reports a lost peer (a symptom)
        kinds = {p["failure_kind"] for i, p in enumerate(done["parties"])
                 if i != 2 and p["state"] == "failed"}
        assert "stalled" in kinds and kinds <= {"stalled", "peer_lost"}, done
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        s.close()


@pytest.mark.skipif(MpycEngine().unavailable_reason() is not None,
                    reason=f"MPyC not available: {MpycEngine().unavailable_reason()}")
def test_a_party_whose_mpyc_worker_alone_freezes_fails_the_job_blaming_nobody(
    tmp_path: Path,
) -> None:
    # the same on MPyC: its workers left waiting on a suspended peer use no CPU either,
    # and its own time limit (from the job's shape) is minutes to hours away
    cluster = DaemonCluster(3, tmp_path, engines=("mpyc",), stall_timeout=STALL)
    cluster.dep.settings[2] = replace(cluster.dep.settings[2], stall_timeout=0.0)
    s = make_stack(tmp_path, cluster=cluster)
    frozen: list[int] = []
    try:
        _, ids, _ = horizontal_setup(s, m=3000, p=16)
        box = s.keys["analyst-1"].box_public_key
        for owner, ds in zip(("owner-a", "owner-b"), ids, strict=True):
            s.client(owner).consent(s.keys[owner], ds, "analyst-1", box)
        analyst = s.client("analyst-1")
        job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2, engine="mpyc",
                             security="passive-3pc")
        server = s.cluster.servers[2]
        assert server is not None
        deadline = time.monotonic() + 120
        while True:  # into the computation: past the connections and the session check
            now = analyst.get_job(job["id"])
            assert now["state"] in ("queued", "running"), now
            if "mean-split" in now["parties"][2]["phase"] and _descendants(server.proc.pid):
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.02)
        frozen = _descendants(server.proc.pid)  # the worker, not the daemon
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        t0 = time.monotonic()
        done = wait_final(analyst, job["id"], timeout=BOUND)
        assert done["state"] == "failed", done
        assert time.monotonic() - t0 < BOUND
        error = done["error"]
        assert "MPyC run made no progress" in error and "a peer stopped answering" in error, done
        assert "no party is blamed" in error, done
        for honest in ("Alice", "Bob"):
            assert f"{honest} failed" not in error, done
        assert done["failure_kind"] == "stalled", done
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        s.close()
