"""A job's files pruned at the parties past their retention (``--job-retention-days``):
the gateway keeps its own record of the job (succeeded, as it ended), and a fetch of
its result names the pruned state at each party, a problem the client shows, never an
internal error."""

from __future__ import annotations

import time

import pytest
from ppfs_client.sdk import ApiError
from service_fakes import Stack, horizontal_setup, wait_final

from ppfs.contract import Reveal

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")

PARTY_DAEMONS = True  # the real party daemons (conftest's stack fixture), MPyC


def test_a_result_fetch_after_the_parties_pruned_the_job_names_it(stack: Stack) -> None:
    s = stack
    _, ids, _ = horizontal_setup(s, m=20, p=4)
    for owner, ds in zip(("owner-a", "owner-b"), ids, strict=True):
        s.client(owner).consent(s.keys[owner], ds, "analyst-1",
                                s.keys["analyst-1"].box_public_key, Reveal.SELECTION)
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=1, engine="mpyc")
    assert wait_final(analyst, job["id"], timeout=120)["state"] == "succeeded"
    assert analyst.fetch_result(s.keys["analyst-1"], job["id"]).indices.size == 1

    month_on = time.time() + 31 * 86_400
    for srv in s.cluster.servers:
        srv.state.jobs.clock = lambda: month_on
        assert s.loop.run(srv.state.jobs.prune()) == [job["id"]]

    got = analyst.get_job(job["id"])  # the gateway's record, as the job ended
    assert got["state"] == "succeeded"
    with pytest.raises(ApiError) as info:
        analyst.fetch_result(s.keys["analyst-1"], job["id"])
    text = str(info.value)
    assert f"the result of job '{job['id']}' was pruned after 30 days at" in text, text
    assert "internal" not in text.lower(), text
