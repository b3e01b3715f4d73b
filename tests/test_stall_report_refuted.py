"""A corrupted party that kills its own engine in the middle of a run and then reports
that its run stalled (it waited, it says, the whole stall limit on a peer it cannot
name) is named: the honest parties lost its engine while they computed, and say how
long they had waited then, a few seconds at most, far less than the stall it claims.

Real parties and real MP-SPDZ engines (in this process): the honest parties' waits are
what their own stall watches saw; only Carol's report is made up, as a corrupted party's
would be."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_fakes import RealCluster, Stack, horizontal_setup, make_stack, wait_final

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
pytestmark = pytest.mark.skipif(_reason is not None,
                                reason=f"MP-SPDZ not available: {_reason}")

CAROL = 2
CLAIM = 601.0  # past the default stall limit, as an honest stall report would be
STALLED = ("the MP-SPDZ run made no progress for 600 s (this party neither computed nor "
           "printed, waiting for its peers): a peer stopped answering; the run stopped")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mp-spdz",)))
    yield s
    s.close()


def _ours(pid: int) -> bool:
    """Whether ``pid`` descends from this process (the daemons run in it): never another
    run's MP-SPDZ party on the same machine."""
    me = os.getpid()
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        pid = int(stat[stat.rfind(b")") + 2:].split()[1])
        if pid == me:
            return True
    return False


def _engine_of(party: int) -> int | None:
    """The pid of this process's MP-SPDZ party process for ``party``, if running."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"-party.x") and b"-p" in argv and \
                    argv[argv.index(b"-p") + 1] == str(party).encode() and _ours(int(entry)):
                return int(entry)
    return None


def _lie_about_the_failure(s: Stack, party: int) -> None:
    """The party reports any failure of its job as a stall of CLAIM seconds."""
    runner = s.cluster.servers[party].state.jobs
    update = runner._update

    async def lying(rec: Any, *, keep: bool = True, **changes: Any) -> None:
        if changes.get("state") == "failed":
            changes.update(error=STALLED, failure="stalled", waited_seconds=CLAIM)
        await update(rec, keep=keep, **changes)

    runner._update = lying


def test_a_party_that_kills_its_engine_and_reports_a_stall_is_named(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=16000, p=16)
    box = stack.keys["analyst-1"].box_public_key
    for owner, ds in zip(("owner-a", "owner-b"), ids, strict=True):
        stack.client(owner).consent(stack.keys[owner], ds, "analyst-1", box)
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2,
                         engine="mp-spdz", security="active-3pc")
    _lie_about_the_failure(stack, CAROL)
    deadline = time.monotonic() + 180  # compiling the program comes first
    while True:
        now = analyst.get_job(job["id"])
        assert now["state"] in ("queued", "running"), now
        pid = _engine_of(CAROL)
        if now["parties"][CAROL]["progress"] >= 0.2 and pid is not None:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    final = wait_final(analyst, job["id"], timeout=60)
    assert final["state"] == "failed"
    assert final["error"].startswith("Carol failed: "), final["error"]
    assert [p["failure_kind"] for p in final["parties"]] == ["peer_lost", "peer_lost", "stalled"]
