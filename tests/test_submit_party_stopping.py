"""A party that was told to stop (SIGTERM, --drain-seconds) says so in its identity, and
the gateway refuses a new job up front, naming it, instead of recording a job its
StartJob will refuse. Availability only: the party still refuses StartJob itself
(tests/test_party_drain.py, and the fake party here does likewise).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from ppfs_client.sdk import ApiError
from service_fakes import Stack, horizontal_setup, run_cli, wait_final


def _stop(stack: Stack, index: int, seconds_left: int) -> None:
    party = stack.cluster.parties[index]
    party.stopping, party.stop_seconds_left = True, seconds_left


def _job_body(ids: list[str]) -> dict[str, Any]:
    return {"dataset_ids": ids, "combination": "horizontal", "label_column": "label",
            "k": 2, "security": "passive-3pc", "engine": "mpyc"}


def test_submit_while_a_party_stops_is_refused_naming_it(stack: Stack, capsys: Any) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    analyst = stack.client("analyst-1")
    analyst.deployment()  # the gateway knows every party before one is stopped
    masks = analyst.list_datasets("mask")
    _stop(stack, 1, 90)
    rc, out, err = run_cli(capsys, stack, "analyst-1", "jobs", "submit", "--dataset", ids[0],
                           "--dataset", ids[1], "--label", "label", "--k", "2",
                           "--engine", "mpyc")
    lines = err.strip().splitlines()
    assert rc == 1 and out == "", (rc, out, err)
    assert lines[-1].startswith("ppfs: error: "), lines
    assert "Bob is stopping" in lines[-1], lines
    assert "no job was submitted and nothing of it was stored; submit again once Bob is " \
        "back" in lines[-1], lines
    assert analyst.list_jobs() == []
    assert analyst.list_datasets("mask") == masks  # no masks made for a job that never ran


def test_the_refusal_is_a_503_with_retry_after_and_states_no_job(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    count = int(analyst.validate_job(_job_body(ids))["outputs"])
    mask = analyst.create_masks(keys, count)  # made while every party takes jobs
    _stop(stack, 1, 90)
    r = httpx.post(stack.gateway.url + "/v1/jobs/validate", json=_job_body(ids),
                   headers={"Authorization": f"Bearer {stack.token['analyst-1']}"})
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 90
    problem = r.json()
    assert problem["type"].endswith("/party-stopping") and "Bob is stopping" in \
        problem["detail"], problem
    # the submission proper (masks already made) is refused the same way, nothing recorded
    with pytest.raises(ApiError) as info:
        analyst.submit(keys, ids, label="label", k=2, engine="mpyc", mask_upload_id=mask)
    assert info.value.status == 503 and info.value.job_created is False
    assert "Bob is stopping" in info.value.detail
    assert analyst.list_jobs() == []
    assert stack.cluster.parties[0].jobs == {}  # no party was asked to start it
    # back up: the same submission runs
    stack.cluster.parties[1].stopping = False
    job = analyst.submit(keys, ids, label="label", k=2, engine="mpyc", mask_upload_id=mask)
    assert wait_final(analyst, job["id"])["state"] == "succeeded"


def test_status_and_the_cli_show_the_stopping_party(stack: Stack, capsys: Any) -> None:
    admin = stack.client("admin")
    admin.deployment()
    _stop(stack, 1, 90)
    r = httpx.get(stack.gateway.url + "/v1/deployment/status",
                  headers={"Authorization": f"Bearer {stack.token['admin']}"})
    assert r.status_code == 200, r.text
    status = r.json()
    assert not status["healthy"]
    alice, bob, carol = status["parties"]
    assert bob["reachable"] and bob["stopping"], bob
    assert "stopping" in bob["problem"], bob
    assert not alice["stopping"] and not carol["stopping"] and alice["problem"] == ""
    rc, out, err = run_cli(capsys, stack, "admin", "deployment")
    assert rc == 0, err
    lines = {line.split()[1]: line for line in out.splitlines() if line[:1].isdigit()}
    assert "stopping" in lines["Bob"], out
    assert "stopping" not in lines["Alice"] and "stopping" not in lines["Carol"], out
