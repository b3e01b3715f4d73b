"""The gateway relays the parties' result parts and can rewrite any of them: another
job's parts under this job's record, parts relabelled between parties, a part from one
fetch with the statement of another, parts in another order, or an answer made of
parts by the million. The recipient opens only the parts every party signed for this
job (in any order, as often as it fetches them) and refuses everything else at once,
naming it; it never opens a wrong result."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ppfs_client.sdk import MAX_ANSWER_BYTES, GatewayClient
from service_fakes import Stack, horizontal_setup, make_stack, wait_final

from ppfs import oracle
from ppfs.contract import ResultRejected

Parts = list[dict[str, Any]]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path)
    yield s
    s.close()


def _two_jobs(s: Stack) -> tuple[str, str, list[str]]:
    """Jobs X (k 3) and Y (k 2) of one recipient on one table; X's selection."""
    t, ids, _ = horizontal_setup(s)
    analyst, key = s.client("analyst-1"), s.keys["analyst-1"]
    x = analyst.submit(key, ids, label="label", k=3, engine="mpyc")["id"]
    y = analyst.submit(key, ids, label="label", k=2, engine="mpyc")["id"]
    for j in (x, y):
        assert wait_final(analyst, j)["state"] == "succeeded"
    want = [t.columns[j] for j in oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 3)]
    assert analyst.fetch_result(key, x).columns == want  # honestly relayed, X opens right
    return x, y, want


def _relaying(client: GatewayClient, rewrite: Callable[[str, Parts], Parts]) -> GatewayClient:
    """The client of a gateway that rewrites the parts it relays for a job."""
    honest = client.result_parts

    def result_parts(job_id: str) -> dict[str, Any]:
        got = honest(job_id)
        return {**got, "parts": rewrite(job_id, got["parts"])}

    client.result_parts = result_parts  # type: ignore[method-assign]
    return client


def _refusal(s: Stack, client: GatewayClient, job_id: str) -> str:
    with pytest.raises(ResultRejected) as info:
        client.fetch_result(s.keys["analyst-1"], job_id)
    return str(info.value)


def test_another_jobs_parts_under_this_jobs_record_are_refused(stack: Stack) -> None:
    x, y, _ = _two_jobs(stack)
    analyst = stack.client("analyst-1")

    def other_job(job_id: str, parts: Parts) -> Parts:  # Y's genuine parts, told as X's
        return [{**p, "job_id": job_id} for p in analyst.result_parts(y)["parts"]]

    err = _refusal(stack, _relaying(stack.client("analyst-1"), other_job), x)
    assert "Alice's part: a result part is not signed by its party for this job" in err, err


def test_parts_relabelled_between_parties_are_refused(stack: Stack) -> None:
    x, _, _ = _two_jobs(stack)

    def swap(job_id: str, parts: Parts) -> Parts:  # Alice's part as Bob's and back
        a, b, c = sorted(parts, key=lambda p: p["party_index"])
        return [{**a, "party_index": 1}, {**b, "party_index": 0}, c]

    err = _refusal(stack, _relaying(stack.client("analyst-1"), swap), x)
    assert "Alice's part: a result part is not signed by its party for this job" in err, err


def test_a_part_with_the_statement_of_another_fetch_is_refused(stack: Stack) -> None:
    x, _, _ = _two_jobs(stack)
    analyst = stack.client("analyst-1")

    def mixed(job_id: str, parts: Parts) -> Parts:  # each fetch seals the words anew
        other = {p["party_index"]: p for p in analyst.result_parts(job_id)["parts"]}
        return [{**p, "statement": other[p["party_index"]]["statement"],
                 "statement_signature": other[p["party_index"]]["statement_signature"]}
                if p["party_index"] == 2 else p for p in parts]

    err = _refusal(stack, _relaying(stack.client("analyst-1"), mixed), x)
    assert "Carol's result statement names another sealed part" in err, err


def test_parts_in_another_order_or_fetched_again_open_the_same_result(stack: Stack) -> None:
    x, _, want = _two_jobs(stack)
    client = _relaying(stack.client("analyst-1"), lambda job_id, parts: parts[::-1])
    for _ in range(2):
        assert client.fetch_result(stack.keys["analyst-1"], x).columns == want


@pytest.mark.parametrize("index", [0, 7], ids=["a-party", "no-party"])
def test_a_result_of_a_million_parts_is_refused_at_once(stack: Stack, index: int) -> None:
    """An answer well within the size the client reads, made of a million parts of one
    party: refused at once, not after comparing every part with every other."""
    x, _, _ = _two_jobs(stack)
    many = [{"party_index": index}] * 1_000_000
    assert len(json.dumps({"parts": many})) < MAX_ANSWER_BYTES
    client = _relaying(stack.client("analyst-1"), lambda job_id, parts: many)
    t0 = time.monotonic()
    err = _refusal(stack, client, x)
    assert time.monotonic() - t0 < 5, "the client took its time over the gateway's parts"
    assert len(err) < 200, err
    assert f"more than one part of {'Alice' if index == 0 else 'party 7'}" in err, err
