"""Bad requests get RFC 9457 problem details with the right status, and nothing is
stored: no data set, upload or job appears and no party receives anything."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import build_upload
from service_fakes import Stack, horizontal_setup, make_stack, owner_table

from ppfs.synthetic import make_table

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("bad"), max_upload_bytes=256 * 1024)
    yield s
    s.close()


def call(
    s: Stack, subject: str | None, method: str, path: str, body: Any = None, **kw: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {s.token[subject]}"} if subject else {}
    headers.update(kw.pop("headers", {}))
    return httpx.request(method, s.gateway.url + path, json=body, headers=headers, timeout=30, **kw)


def problem(resp: httpx.Response, status: int, fragment: str = "") -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    p = resp.json()
    assert p["status"] == status and p["title"] and p["type"].startswith("https://")
    assert fragment.lower() in p["detail"].lower(), p
    return p


def snapshot(s: Stack) -> tuple[Any, ...]:
    admin = s.client("admin")
    return (
        json.dumps(admin.list_datasets("data"), sort_keys=True),
        json.dumps(admin.list_datasets("mask"), sort_keys=True),
        len(admin.list_jobs()),
        sum(len(p.uploads) for p in s.cluster.parties),
    )


def test_authentication_and_roles(stack: Stack) -> None:
    before = snapshot(stack)
    r = call(stack, None, "GET", "/v1/datasets")
    problem(r, 401, "bearer")
    assert r.headers["www-authenticate"] == "Bearer"
    r = call(stack, None, "GET", "/v1/datasets", headers={"Authorization": "Bearer nope"})
    problem(r, 401, "not valid")
    problem(call(stack, "analyst-1", "POST", "/v1/datasets", {"name": "x"}), 403, "data owner")
    ds = stack.client("owner-a").create_dataset("mine")
    problem(
        call(stack, "owner-a", "POST", f"/v1/datasets/{ds['id']}/grants", {"subject": "x"}),
        403,
        "admin",
    )
    # owner-b cannot see owner-a's data set at all
    problem(call(stack, "owner-b", "GET", f"/v1/datasets/{ds['id']}"), 404)
    problem(call(stack, "analyst-1", "GET", f"/v1/datasets/{ds['id']}"), 404)
    assert snapshot(stack)[2:] == before[2:]


def _upload_body(s: Stack, dataset_id: str, subject: str = "owner-a", m: int = 10) -> dict:
    t = make_table(m, 4, seed=1)
    dep = s.client(subject).deployment()
    return build_upload(s.keys[subject], owner_table(t), dataset_id, dep)


def test_malformed_uploads_store_nothing(stack: Stack) -> None:
    a = stack.client("owner-a")
    ds = a.create_dataset("malformed")
    before = snapshot(stack)
    path = f"/v1/datasets/{ds['id']}/uploads"
    good = _upload_body(stack, ds["id"])
    bad_b64 = dict(good, manifest="@@@not base64")
    problem(call(stack, "owner-a", "POST", path, bad_b64), 422)
    not_b64 = dict(good, manifest="AAAA=A==")
    problem(call(stack, "owner-a", "POST", path, not_b64), 422, "base64")
    garbage = dict(good, manifest=base64.b64encode(b"{not json").decode())
    problem(call(stack, "owner-a", "POST", path, garbage), 422, "malformed")
    swapped = dict(good, parts=[good["parts"][1], good["parts"][0], good["parts"][2]])
    problem(call(stack, "owner-a", "POST", path, swapped), 422, "digest")
    short = dict(good, parts=good["parts"][:2])
    problem(call(stack, "owner-a", "POST", path, short), 422, "one sealed part per party")
    other = a.create_dataset("other")
    problem(
        call(stack, "owner-a", "POST", f"/v1/datasets/{other['id']}/uploads", good),
        422,
        "another data set",
    )
    # owner-b signs for owner-a's data set: not its data set
    problem(call(stack, "owner-b", "POST", path, good), 404)
    # a signature by the wrong key: the parties refuse, the gateway stores nothing
    forged = _upload_body(stack, ds["id"])
    forged["manifest_signature"] = base64.b64encode(
        ClientKeys.generate("owner-a").signing.sign(base64.b64decode(forged["manifest"])).signature
    ).decode()
    problem(call(stack, "owner-a", "POST", path, forged), 422, "refused")
    problem(call(stack, "owner-a", "POST", path, {"upload_id": "x"}), 422, "invalid fields")
    after = snapshot(stack)
    assert after[2] == before[2]
    assert [d for d in json.loads(after[0]) if d["id"] != other["id"]] == json.loads(before[0])
    assert a.get_dataset(ds["id"])["upload_ids"] == []
    # a correct upload still goes through afterwards, exactly once
    assert call(stack, "owner-a", "POST", path, good).status_code == 201
    problem(call(stack, "owner-a", "POST", path, good), 409, "already exists")


def test_oversize_upload_is_413(stack: Stack) -> None:
    ds = stack.client("owner-a").create_dataset("big")
    body = _upload_body(stack, ds["id"], m=3000)
    before = snapshot(stack)
    problem(call(stack, "owner-a", "POST", f"/v1/datasets/{ds['id']}/uploads", body), 413)
    # also when the client lies about the length and streams more
    blob = json.dumps(body).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(blob), 65536):
            yield blob[i : i + 65536]

    r = httpx.post(
        stack.gateway.url + f"/v1/datasets/{ds['id']}/uploads",
        content=chunks(),
        headers={
            "Authorization": f"Bearer {stack.token['owner-a']}",
            "Content-Type": "application/json",
        },
        timeout=30,
    )
    problem(r, 413)
    assert snapshot(stack) == before


def test_bad_jobs_store_nothing(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=5)
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    mask = analyst.create_masks(keys, 2)  # k words: a service job opens no D'
    base = {
        "dataset_ids": ids,
        "label_column": "label",
        "k": 2,
        "security": "passive-3pc",
        "engine": "mpyc",
        "recipient_public_key": base64.b64encode(keys.box_public_key).decode(),
        "mask_upload_id": mask,
    }
    before = snapshot(stack)
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, dataset_ids=["nope"])), 404)
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, k=5)), 422, "k must")
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, k=7)), 422, "k must")
    problem(
        call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, label_column="outcome")),
        422,
        "label",
    )
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, combination="vertical")), 422)
    problem(
        call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, security="active-4pc")),
        422,
        "parties",
    )
    problem(
        call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, mask_upload_id="nomask")),
        404,
        "mask",
    )
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, k=1)), 422, "mask words")
    problem(
        call(
            stack,
            "analyst-1",
            "POST",
            "/v1/jobs",
            dict(base, recipient_public_key=base64.b64encode(b"short").decode()),
        ),
        422,
        "32-byte",
    )
    bad = dict(base)
    del bad["label_column"]
    problem(call(stack, "analyst-1", "POST", "/v1/jobs", bad), 422, "label_column")
    # incompatible schemas: a data set with other columns, combined horizontally
    c = stack.client("owner-a")
    t = make_table(20, 3, seed=9)
    ds_c = c.create_dataset("narrow")
    c.upload_table(stack.keys["owner-a"], owner_table(t), ds_c["id"])
    stack.client("admin").grant(ds_c["id"], "analyst-1")
    before = snapshot(stack)
    r = call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, dataset_ids=[ids[0], ds_c["id"]]))
    problem(r, 422, "schema")
    # the owner of one data set cannot run a job on another owner's data
    problem(call(stack, "owner-b", "POST", "/v1/jobs", base), 404)
    problem(call(stack, "analyst-1", "GET", "/v1/jobs/unknown"), 404)
    problem(call(stack, "analyst-1", "GET", "/v1/jobs/unknown/result"), 404)
    problem(call(stack, "analyst-1", "GET", "/v1/nothing-here"), 404)
    assert snapshot(stack) == before
    assert all(not p.jobs for p in stack.cluster.parties)
    # and no problem echoes a sealed part or a token
    r = call(stack, "analyst-1", "POST", "/v1/jobs", dict(base, k="x" * 50))
    assert "x" * 50 not in r.text and np.all([tok not in r.text for tok in stack.token.values()])
