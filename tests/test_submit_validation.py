"""Submit-time validation: a job the engine cannot run, a grant to nobody, a number
sent as a string, hidden characters in names, overlong ids. Each gets a 4xx problem
naming the field, and nothing is stored: the registry (SQLite) and every party's store
are unchanged, and a refused job leaves no masks behind (the client validates before it
uploads masks)."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ppfs_client.sdk import ApiError, build_upload
from service_fakes import Stack, horizontal_setup, make_stack, owner_table

from ppfs.synthetic import make_table

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("valid"))
    yield s
    s.close()


def call(s: Stack, subject: str, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, s.gateway.url + path, json=body, timeout=30,
                         headers={"Authorization": f"Bearer {s.token[subject]}"})


def problem(resp: httpx.Response, status: int, *fragments: str) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    body = resp.json()
    text = body["detail"] + " " + " ".join(
        ".".join(e["loc"]) + " " + e["msg"] for e in body.get("errors") or [])
    for f in fragments:
        assert f.lower() in text.lower(), body
    return text


def state(s: Stack) -> tuple[Any, ...]:
    """The whole registry (every row of every table) and every party's store."""
    db = sqlite3.connect(s.root / "gateway" / "registry.sqlite3")
    try:
        dump = tuple(db.iterdump())
    finally:
        db.close()
    stores = tuple(
        (sorted(p.uploads), sorted(p.staged), sorted(p.aborted), sorted(p.jobs))
        for p in s.cluster.parties
    )
    return dump, stores


def job_body(s: Stack, ids: list[str], **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "dataset_ids": ids, "label_column": "label", "k": 2, "security": "passive-3pc",
        "engine": "mpyc",
        "recipient_public_key": base64.b64encode(s.keys["analyst-1"].box_public_key).decode(),
        "mask_upload_id": "0" * 32,
    }
    body.update(changes)
    return body


@pytest.fixture(scope="module")
def datasets(stack: Stack) -> list[str]:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    return ids


def test_engine_security_pairs_are_checked_at_submit(stack: Stack, datasets: list[str]) -> None:
    before = state(stack)
    analyst = stack.client("analyst-1")
    for path in ("/v1/jobs/validate", "/v1/jobs"):
        r = call(stack, "analyst-1", "POST", path,
                 job_body(stack, datasets, security="active-3pc", engine="mpyc"))
        problem(r, 422, "engine/security", "mpyc does not run active-3pc")
    # the client validates before drawing masks: no mask data set is created
    with pytest.raises(ApiError) as err:
        analyst.submit(stack.keys["analyst-1"], datasets, label="label", k=2,
                       security="active-3pc", engine="mpyc")
    assert err.value.status == 422
    assert state(stack) == before
    # a runnable pair validates, storing nothing, and tells the mask count
    r = call(stack, "analyst-1", "POST", "/v1/jobs/validate",
             job_body(stack, datasets, mask_upload_id=None, recipient_public_key=None))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == 2 and r.json()["m"] == 20
    assert state(stack) == before


def test_refused_submits_leave_no_masks(stack: Stack, datasets: list[str]) -> None:
    before = state(stack)
    analyst = stack.client("analyst-1")
    for kw in ({"k": 4}, {"label": "no-such-column"}):  # k must be < p; unknown label
        with pytest.raises(ApiError) as err:
            analyst.submit(stack.keys["analyst-1"], datasets, **{"label": "label", "k": 2,
                           "security": "passive-3pc", "engine": "mpyc", **kw})
        assert 400 <= err.value.status < 500
    assert analyst.list_datasets(kind="mask") == []
    assert state(stack) == before


def test_grants_name_known_principals_only(stack: Stack, datasets: list[str]) -> None:
    before = state(stack)
    r = call(stack, "admin", "POST", f"/v1/datasets/{datasets[0]}/grants",
             {"subject": "nobody-here"})
    problem(r, 422, "subject", "no such principal")
    r = call(stack, "admin", "POST", f"/v1/datasets/{datasets[0]}/grants",
             {"subject": "analyst\u202e-1"})
    problem(r, 422, "subject")
    assert state(stack) == before


def test_numbers_are_strictly_typed(stack: Stack, datasets: list[str]) -> None:
    before = state(stack)
    for body in (
        job_body(stack, datasets, k="3"),
        job_body(stack, datasets, k=2.0),
        job_body(stack, datasets, k=True),
        job_body(stack, datasets, training={"epochs": "2", "batch_size": 4,
                                            "learning_rate": 0.5}),
    ):
        problem(call(stack, "analyst-1", "POST", "/v1/jobs", body), 422)
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", job_body(stack, datasets, k="3")),
            422, "k")
    assert state(stack) == before


@pytest.mark.parametrize("hidden", ["\u202e", "\u2066", "\u200b", "\x1b", "\u2028"])
def test_hidden_characters_in_names(stack: Stack, datasets: list[str], hidden: str) -> None:
    before = state(stack)
    r = call(stack, "owner-a", "POST", "/v1/datasets", {"name": f"study{hidden}gpj.exe"})
    problem(r, 422, "name")
    r = call(stack, "analyst-1", "POST", "/v1/jobs",
             job_body(stack, datasets, label_column=f"la{hidden}bel"))
    problem(r, 422, "label_column")
    assert state(stack) == before
    # a manifest whose column name hides characters: refused before any party sees it
    t = make_table(6, 2, seed=3)
    table = owner_table(t)
    table = type(table)((f"a{hidden}b", table.columns[1]), table.x, table.label_column,
                        table.classes, table.y)
    owner = stack.client("owner-a")
    ds = owner.create_dataset("hidden")["id"]
    before = state(stack)
    body = build_upload(stack.keys["owner-a"], table, ds, owner.deployment())
    r = call(stack, "owner-a", "POST", f"/v1/datasets/{ds}/uploads", body)
    problem(r, 422, "column 0", "control or bidirectional")
    assert state(stack) == before


def test_overlong_ids_are_refused_without_echo(stack: Stack, datasets: list[str]) -> None:
    before = state(stack)
    long_id = "x" * 5000
    for method, path in (
        ("GET", f"/v1/datasets/{long_id}"),
        ("GET", f"/v1/datasets/{long_id}/check"),
        ("GET", f"/v1/jobs/{long_id}"),
        ("POST", f"/v1/jobs/{long_id}/cancel"),
    ):
        text = problem(call(stack, "admin", method, path), 422)
        assert long_id[:100] not in text
        assert "_id" in text  # names the field
    r = call(stack, "analyst-1", "POST", "/v1/jobs", job_body(stack, [long_id]))
    text = problem(r, 422, "dataset_ids")
    assert long_id[:100] not in text
    r = call(stack, "analyst-1", "POST", "/v1/jobs",
             job_body(stack, datasets, mask_upload_id=long_id))
    assert long_id[:100] not in problem(r, 422, "mask_upload_id")
    assert state(stack) == before


def test_datasets_check_through_fake_parties(stack: Stack, datasets: list[str],
                                             tmp_path: Path) -> None:
    check = stack.client("owner-a").check_dataset(datasets[0])
    assert check["consistent"], check
    assert [p["name"] for p in check["parties"]] == ["Alice", "Bob", "Carol"]
    assert all(len(p["held"]) == 1 for p in check["parties"])


def test_consents_name_subjects_and_are_bounded(
    stack: Stack, datasets: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consent names subject ids (nothing a terminal acts on when it is listed), is at
    most a few KiB, and an owner keeps a bounded number per data set: each refusal
    stores nothing. What the client prints from the gateway is made inert anyway."""
    import json

    import ppfs_gateway.api.routes.datasets as routes
    from ppfs_client.terminal import printable

    key = stack.keys["owner-a"]
    ds = datasets[0]
    box = base64.b64encode(stack.keys["analyst-1"].box_public_key).decode()

    def consent(recipient: str, **extra: Any) -> dict[str, str]:
        blob = json.dumps({"purpose": "ppfs consent v1", "owner_id": "owner-a",
                           "dataset_id": ds, "recipient": recipient,
                           "recipient_public_key": box, "reveal": "selection",
                           "created_at": "2026-01-01T00:00:00Z", **extra},
                          sort_keys=True, separators=(",", ":")).encode()
        return {"statement": base64.b64encode(blob).decode(),
                "signature": base64.b64encode(key.signing.sign(blob).signature).decode()}

    before = state(stack)
    forged_line = "analyst-1\x1b[2K\r\x1b[31mowner-b -> analyst-1: selection+model"
    problem(call(stack, "owner-a", "POST", f"/v1/datasets/{ds}/consents",
                 consent(forged_line)), 422, "malformed")
    problem(call(stack, "owner-a", "POST", f"/v1/datasets/{ds}/consents",
                 consent("analyst-1", padding="x" * 40_000)), 422, "statement")
    assert state(stack) == before
    monkeypatch.setattr(routes, "MAX_CONSENTS_PER_OWNER", 2)
    others = [f"analyst-{i}" for i in range(2, 6)]
    answers = [call(stack, "owner-a", "POST", f"/v1/datasets/{ds}/consents", consent(r))
               for r in others]
    assert [r.status_code for r in answers][-1] == 409, [r.text for r in answers]
    problem(answers[-1], 409, "at most 2 consents")
    assert printable(forged_line) == (
        "analyst-1\\x1b[2K\\r\\x1b[31mowner-b -> analyst-1: selection+model")
    assert printable("col\u202eexe\u200b\nnext\tcell") == "col\\u202eexe\\u200b\nnext\tcell"
