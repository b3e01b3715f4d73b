"""A party that reports its run stalled (FAILURE_KIND_STALLED: it waited on a peer that
stopped answering, and cannot see which) does not settle a job's blame on its own.

When one party's engine process is stopped (SIGSTOP, a machine swapping it out), the
honest peers' stall watches fire, and so does that party's own watch, which sees its own
process stopped and reports a failure of its own: all after the same stall limit, a few
seconds apart. The gateway must name that party whichever report arrives first, as it
does for a lost peer, rather than end the job "blaming nobody" on the first stall."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from ppfs_gateway.core.config import load_settings
from service_fakes import (
    FakeCluster,
    Stack,
    horizontal_setup,
    make_stack,
    tokens,
    wait_final,
    wait_running,
)

from ppfs.errors import ParameterError
from ppfs.v1 import party_pb2 as pb

HOLD_JOBS = True  # the fake parties hold every job running until released

STALLED = ("the MP-SPDZ run made no progress for 600 s (this party neither computed nor "
           "printed, waiting for its peers): a peer stopped answering; the run stopped")
OWN = ("the MP-SPDZ run made no progress for 600 s: this party's (Carol) engine process "
       "is stopped (suspended); the run stopped")


def _report(s: Stack, job_id: str, party: int, failure: int, error: str,
            waited: float | None = None) -> None:
    async def go() -> None:
        extra = {} if waited is None else {"waited_seconds": waited}
        s.cluster.parties[party].set(job_id, state=pb.JOB_STATE_FAILED, phase="failed",
                                     error=error, failure=failure, **extra)
    s.loop.run(go())


def _started(s: Stack) -> str:
    _, ids, _ = horizontal_setup(s, m=20, p=4)
    job = s.client("analyst-1").submit(s.keys["analyst-1"], ids, label="label", k=2,
                                       engine="mpyc")
    job_id = str(job["id"])
    wait_running(s.client("analyst-1"), job_id)
    return job_id


def test_a_stall_reported_first_still_names_the_party_whose_engine_stopped(
    stack: Stack,
) -> None:
    job_id = _started(stack)
    _report(stack, job_id, 0, pb.FAILURE_KIND_STALLED, STALLED)  # Alice waited on Carol
    time.sleep(1.0)  # Carol's own watch fires a sample or two later
    _report(stack, job_id, 2, pb.FAILURE_KIND_OWN, OWN)
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["state"] == "failed"
    assert final["error"].startswith("Carol failed: "), final["error"]
    assert "no party is blamed" not in final["error"]
    # the job's failure kind (REST failure_kind, the jobs_finished metric's label) is
    # the named party's, not the stall of a party listed before it
    assert final["failure_kind"] == "own", final


def test_a_lost_peer_finding_a_stall_keeps_looking_for_the_cause(stack: Stack) -> None:
    job_id = _started(stack)
    # Alice lost Bob's engine as it stopped, Bob's watch having fired; Carol's own
    # failure (her engine was the one stopped) comes a little later
    _report(stack, job_id, 0, pb.FAILURE_KIND_PEER_LOST, "lost its peer Bob")
    time.sleep(0.2)
    _report(stack, job_id, 1, pb.FAILURE_KIND_STALLED, STALLED)
    time.sleep(1.0)
    _report(stack, job_id, 2, pb.FAILURE_KIND_OWN, OWN)
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["error"].startswith("Carol failed: "), final["error"]


def test_a_party_that_stops_its_engine_and_reports_a_stall_is_named(stack: Stack) -> None:
    # Carol kills her engine while Alice and Bob compute, then claims she waited 600 s
    # on a peer: they lost her having waited a second or two, which refutes her stall
    job_id = _started(stack)
    _report(stack, job_id, 0, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=1.0)
    _report(stack, job_id, 1, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=2.5)
    time.sleep(0.5)
    _report(stack, job_id, 2, pb.FAILURE_KIND_STALLED, STALLED, waited=601.0)
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["state"] == "failed"
    assert final["error"].startswith("Carol failed: "), final["error"]
    assert "no party is blamed" not in final["error"]


def test_a_stall_reported_first_is_refuted_all_the_same(stack: Stack) -> None:
    job_id = _started(stack)
    _report(stack, job_id, 2, pb.FAILURE_KIND_STALLED, STALLED, waited=601.0)
    time.sleep(0.5)
    _report(stack, job_id, 0, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=0.0)
    _report(stack, job_id, 1, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=3.0)
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["error"].startswith("Carol failed: "), final["error"]


def test_one_corrupted_party_cannot_get_an_honest_stall_reporter_named(stack: Stack) -> None:
    # Carol froze her engine: Alice stalled after 601 s; Bob, left waiting as long, lost
    # Alice when her engine stopped; Carol then says she lost Alice at once. Bob's long
    # wait backs Alice's stall: nobody is named, as for any freeze nobody can pin
    job_id = _started(stack)
    _report(stack, job_id, 0, pb.FAILURE_KIND_STALLED, STALLED, waited=601.0)
    _report(stack, job_id, 1, pb.FAILURE_KIND_PEER_LOST, "lost its peer Alice", waited=598.0)
    _report(stack, job_id, 2, pb.FAILURE_KIND_PEER_LOST, "lost its peer Alice", waited=0.0)
    final = wait_final(stack.client("analyst-1"), job_id)
    assert final["state"] == "failed"
    assert "no party is blamed" in final["error"], final["error"]
    assert not final["error"].startswith(("Alice failed", "Bob failed", "Carol failed"))


def test_a_party_that_reports_no_wait_backs_the_stall(stack: Stack) -> None:
    # Bob runs without a stall watch (or predates waited_seconds): his word is unknown,
    # and unknown never names the stall reporter
    job_id = _started(stack)
    _report(stack, job_id, 0, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=1.0)
    _report(stack, job_id, 1, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol")
    _report(stack, job_id, 2, pb.FAILURE_KIND_STALLED, STALLED, waited=601.0)
    final = wait_final(stack.client("analyst-1"), job_id)
    assert "no party is blamed" in final["error"], final["error"]


def _status(failure: int, waited: float | None = None) -> pb.JobStatus:
    st = pb.JobStatus(state=pb.JOB_STATE_FAILED, failure=failure)
    if waited is not None:
        st.waited_seconds = waited
    return st


def test_the_refutation_rule() -> None:
    from ppfs_gateway.jobs import refuted_stall

    lost, stalled = pb.FAILURE_KIND_PEER_LOST, pb.FAILURE_KIND_STALLED
    liar = {"Alice": _status(lost, 1.0), "Bob": _status(lost, 0.0),
            "Carol": _status(stalled, 600.0)}
    assert refuted_stall(liar) == ("Carol", 600.0, 1.0)
    # a wait comparable to the claimed idle time, an unknown one, a party that did not
    # lose a peer, or a second stall report backs it
    for bob in (_status(lost, 597.0), _status(lost), _status(pb.FAILURE_KIND_OWN, 0.0),
                _status(stalled, 600.0), pb.JobStatus(state=pb.JOB_STATE_RUNNING)):
        assert refuted_stall({**liar, "Bob": bob}) is None
    # a claim of unknown length, or one too short to tell from the watches' sampling
    # (the 4 s limits of the real-daemon freeze tests), is never refuted
    assert refuted_stall({**liar, "Carol": _status(stalled)}) is None
    assert refuted_stall({"Alice": _status(lost, 0.0), "Bob": _status(lost, 0.0),
                          "Carol": _status(stalled, 7.0)}) is None
    # two parties: the other's word alone would decide
    assert refuted_stall({"Alice": _status(lost, 0.0), "Carol": _status(stalled, 600.0)}) \
        is None


# -- the stall floor: no party of the deployment stalls sooner (stall_floor_seconds) --


def _liar_claims(s: Stack, waited: float | None) -> str:
    # Carol kills her engine while Alice and Bob compute, then claims a short stall, as
    # though her limit were a few seconds: they lost her having waited next to nothing
    job_id = _started(s)
    _report(s, job_id, 0, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=0.0)
    _report(s, job_id, 1, pb.FAILURE_KIND_PEER_LOST, "lost its peer Carol", waited=0.5)
    time.sleep(0.5)
    _report(s, job_id, 2, pb.FAILURE_KIND_STALLED, STALLED, waited=waited)
    final = wait_final(s.client("analyst-1"), job_id)
    assert final["state"] == "failed", final
    return str(final["error"])


def test_a_short_stall_claim_is_taken_as_the_floor_and_refuted(stack: Stack) -> None:
    # the default floor (60 s): a 5 s claim counts as 60 s, which waits of a second refute
    assert stack.gateway.settings.stall_floor_seconds == 60.0
    error = _liar_claims(stack, 5.0)
    assert error.startswith("Carol failed: "), error
    assert "no party is blamed" not in error
    assert "after 5 s" in error and "60 s" in error, error


def test_a_stall_claimed_without_its_length_is_taken_as_the_floor(stack: Stack) -> None:
    error = _liar_claims(stack, None)
    assert error.startswith("Carol failed: "), error


def test_without_a_floor_a_short_claim_is_taken_at_its_word(tmp_path: Path) -> None:
    # stall_floor_seconds 0 (some party runs a stall limit of a few seconds): nothing can
    # tell a 5 s claim from the watches' sampling, so the stall names nobody
    s = make_stack(tmp_path, stall_floor_seconds=0.0)
    s.cluster.hold = True
    try:
        for waited in (5.0, None):
            error = _liar_claims(s, waited)
            assert "no party is blamed" in error, (waited, error)
            assert not error.startswith(("Alice failed", "Bob failed", "Carol failed"))
    finally:
        s.close()


@pytest.mark.parametrize("floor", [60.0, 600.0])
def test_the_floor_does_not_let_one_corrupted_party_frame_an_honest_one(
    tmp_path: Path, floor: float,
) -> None:
    # Alice stalled honestly after 600 s (her limit, at least the floor); Bob, left
    # waiting as long, lost her at 598 s; Carol, who froze her engine, says she lost
    # Alice at once. Bob's long wait backs Alice's stall whatever the floor
    s = make_stack(tmp_path, stall_floor_seconds=floor)
    s.cluster.hold = True
    try:
        job_id = _started(s)
        _report(s, job_id, 0, pb.FAILURE_KIND_STALLED, STALLED, waited=600.0)
        _report(s, job_id, 1, pb.FAILURE_KIND_PEER_LOST, "lost its peer Alice", waited=598.0)
        _report(s, job_id, 2, pb.FAILURE_KIND_PEER_LOST, "lost its peer Alice", waited=0.0)
        final = wait_final(s.client("analyst-1"), job_id)
        assert final["state"] == "failed"
        assert "no party is blamed" in final["error"], final["error"]
        assert not final["error"].startswith(("Alice failed", "Bob failed", "Carol failed"))
    finally:
        s.close()


def test_the_refutation_rule_with_a_floor() -> None:
    from ppfs_gateway.jobs import refuted_stall

    lost, stalled = pb.FAILURE_KIND_PEER_LOST, pb.FAILURE_KIND_STALLED
    others = {"Alice": _status(lost, 0.0), "Bob": _status(lost, 1.0)}
    # a claim below the floor, none, or a NaN counts as the floor: 60 / 2 - 6 = 24 s
    for claim in (5.0, 0.0, -3.0, float("nan"), None):
        report = {**others, "Carol": _status(stalled, claim)}
        assert refuted_stall(report, floor=60.0) is not None, claim
        assert refuted_stall(report) is None, claim  # no floor: the old rule
    found = refuted_stall({**others, "Carol": _status(stalled, 5.0)}, floor=60.0)
    assert found == ("Carol", 5.0, 1.0)
    assert refuted_stall({**others, "Carol": _status(stalled, None)}, floor=60.0) == \
        ("Carol", None, 1.0)
    # the floor's refuting bound, not more: a wait of 24 s or more backs the stall
    near = {"Alice": _status(lost, 23.9), "Bob": _status(lost, 0.0),
            "Carol": _status(stalled, 5.0)}
    assert refuted_stall(near, floor=60.0) == ("Carol", 5.0, 23.9)
    assert refuted_stall({**near, "Alice": _status(lost, 24.0)}, floor=60.0) is None
    # a claim above the floor keeps its own bound
    assert refuted_stall({**near, "Carol": _status(stalled, 600.0)}, floor=60.0) == \
        ("Carol", 600.0, 23.9)
    # an honest stall backed by a long wait, a second stall, or two parties: as before
    honest = {"Alice": _status(stalled, 600.0), "Bob": _status(lost, 598.0),
              "Carol": _status(lost, 0.0)}
    assert refuted_stall(honest, floor=60.0) is None
    assert refuted_stall(honest, floor=600.0) is None
    assert refuted_stall({**others, "Alice": _status(stalled, 5.0),
                          "Carol": _status(stalled, 5.0)}, floor=60.0) is None
    assert refuted_stall({"Alice": _status(lost, 0.0), "Carol": _status(stalled, 5.0)},
                         floor=60.0) is None


def test_the_stall_floor_setting(tmp_path: Path) -> None:
    cfg, _ = tokens(("admin", "root"))
    cluster = FakeCluster(3, tmp_path)  # its PKI only
    settings = cluster.gateway_settings(tmp_path / "gateway", cfg)
    assert settings.stall_floor_seconds == 60.0
    for ok in (0, 4, 600, 86_400):
        assert cluster.gateway_settings(tmp_path / "gateway", cfg,
                                        stall_floor_seconds=ok).stall_floor_seconds == ok
    body = json.loads(settings.model_dump_json(exclude={"tokens_file"}))
    body["tokens"] = cfg
    config = tmp_path / "gateway.json"
    for bad in (-1, 86_401, "NaN", "inf", "sixty", None):
        config.write_text(json.dumps({**body, "stall_floor_seconds": bad}))
        with pytest.raises(ParameterError) as err:
            load_settings(config, env={})
        msg = str(err.value)
        assert "invalid gateway config in stall_floor_seconds" in msg, (bad, msg)
        assert "smallest --stall-timeout of any party" in msg, msg
    config.write_text(json.dumps({**body, "stall_floor_seconds": 4}))
    assert load_settings(config, env={}).stall_floor_seconds == 4.0
