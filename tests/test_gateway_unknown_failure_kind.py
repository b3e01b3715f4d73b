"""A party newer than the gateway may report a failure kind the gateway does not know
(FAILURE_KIND_STALLED, value 10, was one to every gateway before it). The gateway still
ends the job: it names the reporter as the party that failed, as for a failure of no
stated kind, and shows the kind as "other", rather than failing to read the report and
leaving the job running."""

from __future__ import annotations

from service_fakes import Stack, horizontal_setup, wait_final, wait_running

from ppfs.contract import FailureKind
from ppfs.v1 import party_pb2 as pb

HOLD_JOBS = True  # the fake parties hold every job running until released

UNKNOWN = max(pb.FailureKind.values()) + 1  # a kind added after this gateway


def test_a_kind_the_gateway_does_not_know_reads_as_none() -> None:
    assert FailureKind.from_proto(UNKNOWN) is None
    assert FailureKind.from_proto(pb.FAILURE_KIND_UNSPECIFIED) is None
    assert FailureKind.from_proto(pb.FAILURE_KIND_OWN) is FailureKind.OWN


def test_a_job_failed_with_an_unknown_kind_ends_naming_the_reporter(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    analyst = stack.client("analyst-1")
    job_id = str(analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2,
                                engine="mpyc")["id"])
    wait_running(analyst, job_id)

    async def report() -> None:
        stack.cluster.parties[1].set(job_id, state=pb.JOB_STATE_FAILED, phase="failed",
                                     error="a reason of a newer kind", failure=UNKNOWN)
    stack.loop.run(report())
    final = wait_final(analyst, job_id, timeout=30)
    assert final["state"] == "failed", final
    assert final["error"] == "Bob failed: a reason of a newer kind", final["error"]
    assert final["failure_kind"] == "other", final
