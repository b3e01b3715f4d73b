"""A job running when the whole deployment stops (`ppfs up` stopped mid-job, then started
again) fails without blaming a party: every party reports that it was stopped. A single
party that stopped while its peers ran on is still named."""

from __future__ import annotations

import asyncio
from pathlib import Path

from service_fakes import Stack, horizontal_setup, wait_final, wait_running

from ppfs.v1 import party_pb2 as pb

HOLD_JOBS = True  # the fake parties hold every job running until released


def _stopped(s: Stack, job_id: str, parties: range) -> None:
    async def go() -> None:
        for i in parties:
            s.cluster.parties[i].set(job_id, state=pb.JOB_STATE_FAILED, phase="failed",
                                     error="party stopped", failure=pb.FAILURE_KIND_RESTARTED)
    s.loop.run(go())


def _submit(s: Stack, ids: list[str]) -> str:
    job = s.client("analyst-1").submit(s.keys["analyst-1"], ids, label="label", k=2,
                                       engine="mpyc")
    return str(job["id"])


def test_every_party_stopped_blames_none(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    job_id = _submit(stack, ids)
    wait_running(stack.client("analyst-1"), job_id)
    stack.gateway.stop()  # ppfs up stops the gateway, then the parties
    _stopped(stack, job_id, range(3))
    stack.restart_gateway()  # and starts them all again
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["state"] == "failed"
    assert "every party was stopped while it ran" in final["error"], final["error"]
    assert "no party is blamed" in final["error"]
    for name in ("Alice", "Bob", "Carol"):
        assert name not in final["error"]


def test_one_party_stopped_is_named(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    job_id = _submit(stack, ids)
    wait_running(stack.client("analyst-1"), job_id)
    _stopped(stack, job_id, range(2, 3))  # Carol alone; Alice and Bob still run
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["state"] == "failed"
    assert final["error"] == "Carol failed: party stopped", final["error"]


class _FakeProc:
    """A daemon as `Stack.stop` sees it: it exits a moment after SIGTERM."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        self.events.append(f"term {self.name}")
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, self._exit)

    def _exit(self) -> None:
        self.returncode = 0
        self.events.append(f"exit {self.name}")

    async def wait(self) -> int:
        while self.returncode is None:
            await asyncio.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        self._exit()


def test_ppfs_up_stops_the_gateway_before_the_parties(tmp_path: Path) -> None:
    from ppfs_cli.devstack import Stack, StackLayout

    events: list[str] = []
    stack = Stack(StackLayout(tmp_path, 3))
    stack.procs = [(n, _FakeProc(n, events))
                   for n in ("alice", "bob", "carol", "gateway")]
    asyncio.run(stack.stop())
    assert events[:2] == ["term gateway", "exit gateway"], events
    assert sorted(events[2:]) == sorted(
        f"{what} {n}" for what in ("term", "exit") for n in ("alice", "bob", "carol"))
    assert stack.procs == []
