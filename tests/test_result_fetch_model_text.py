"""`ppfs result fetch` prints a trained model readably: per target the intercept and the
selected columns' weights, best first, not a JSON dump naming every column of the data set
with weight 0; `--json` still gives the whole model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from service_fakes import Stack, horizontal_setup, run_cli, wait_final


def test_model_text_names_the_selected_columns_only(stack: Stack, capsys: Any) -> None:
    t, ids, _ = horizontal_setup(stack, m=40, p=8)
    rc, out, err = run_cli(capsys, stack, "analyst-1", "jobs", "submit", "--dataset", ids[0],
                           "--dataset", ids[1], "--label", "label", "--k", "3",
                           "--engine", "mpyc", "--train", "--epochs", "2")
    assert rc == 0, err
    job_id = out.strip().splitlines()[-1]
    assert wait_final(stack.client("analyst-1"), job_id)["state"] == "succeeded"
    rc, out, err = run_cli(capsys, stack, "analyst-1", "result", "fetch", job_id, "--json")
    assert rc == 0, err
    whole = json.loads(out)
    selected, model = whole["selected"], whole["model"]
    assert len(model["models"][0]["weights"]) == t.p  # --json: the whole model
    rc, out, err = run_cli(capsys, stack, "analyst-1", "result", "fetch", job_id)
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert "{" not in out
    head = lines.index(next(line for line in lines if line.startswith("model ")))
    assert "2 epochs" in lines[head] and "the columns not selected weigh 0" in lines[head]
    row = model["models"][0]
    assert lines[head + 1] == f"  {row['target']}: intercept {row['intercept']:.6g}"
    weights = [line.split() for line in lines[head + 2:]]
    assert [w[0] for w in weights] == selected  # best first, nothing else
    assert [float(w[1]) for w in weights] == pytest.approx(
        [row["weights"][c] for c in selected], rel=1e-5, abs=1e-12)
