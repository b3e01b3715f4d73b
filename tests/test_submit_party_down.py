"""`ppfs jobs submit` while a party is down: the gateway's check that every party holds
the data sets names the party before any output mask is drawn or uploaded, and the
analyst is told that no job was submitted and why, not of an "upload" they never asked
for."""

from __future__ import annotations

from typing import Any

from service_fakes import Stack, horizontal_setup, run_cli


def test_submit_with_a_party_down_says_no_job_was_submitted(stack: Stack, capsys: Any) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    analyst = stack.client("analyst-1")
    analyst.deployment()  # the gateway knows every party before one goes down
    masks = analyst.list_datasets("mask")
    stack.loop.run(stack.cluster.stop_party(2))
    rc, out, err = run_cli(capsys, stack, "analyst-1", "jobs", "submit", "--dataset", ids[0],
                           "--dataset", ids[1], "--label", "label", "--k", "2",
                           "--engine", "mpyc")
    lines = err.strip().splitlines()
    assert rc == 1 and out == "", (rc, out, err)
    assert lines[-1].startswith("ppfs: error: "), lines
    assert "Carol did not answer ListUploads (unavailable): no job was submitted and nothing " \
        "of it was stored; submit again once Carol answers" in lines[-1], lines
    assert analyst.list_jobs() == []
    assert analyst.list_datasets("mask") == masks  # no masks made for a job that never ran


def test_check_with_a_party_down_says_unknown_not_inconsistent(stack: Stack,
                                                               capsys: Any) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    rc, out, err = run_cli(capsys, stack, "owner-a", "datasets", "check", ids[0])
    assert rc == 0 and "every party holds exactly them" in out, (out, err)
    stack.loop.run(stack.cluster.stop_party(2))
    rc, out, err = run_cli(capsys, stack, "owner-a", "datasets", "check", ids[0])
    head = out.splitlines()[0]
    assert rc == 1, (out, err)
    assert head.endswith("uploads recorded, UNKNOWN: Carol did not answer; every party that "
                         "did holds exactly them"), head
    assert "INCONSISTENT" not in out


def test_check_with_a_lost_part_names_the_repair(stack: Stack, capsys: Any) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    bob = stack.cluster.parties[1]
    bob.uploads.pop(next(iter(bob.uploads)))  # Bob lost a part of owner-a's upload
    rc, out, err = run_cli(capsys, stack, "owner-a", "datasets", "check", ids[0])
    head = out.splitlines()[0]
    assert rc == 1, (out, err)
    assert head.endswith(f"INCONSISTENT (the owner of an upload a party lacks re-sends it: "
                         f"`ppfs datasets repair {ids[0]}`)"), head
