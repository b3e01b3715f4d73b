"""`ppfs jobs submit` while a party is down: the output masks cannot be uploaded, and the
analyst is told that no job was submitted and why, not only of an "upload" they never
asked for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_fakes import Stack, horizontal_setup, make_stack, run_cli


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path)
    yield s
    s.close()


def test_submit_with_a_party_down_says_no_job_was_submitted(stack: Stack, capsys: Any) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    analyst = stack.client("analyst-1")
    analyst.deployment()  # the gateway knows every party before one goes down
    stack.loop.run(stack.cluster.stop_party(2))
    rc, out, err = run_cli(capsys, stack, "analyst-1", "jobs", "submit", "--dataset", ids[0],
                           "--dataset", ids[1], "--label", "label", "--k", "2",
                           "--engine", "mpyc")
    lines = err.strip().splitlines()
    assert rc == 1 and out == "", (rc, out, err)
    assert lines[-1].startswith("ppfs: error: "), lines
    assert "no job was submitted: uploading its output masks failed: " in lines[-1], lines
    assert "Carol" in lines[-1]
    assert analyst.list_jobs() == []
