"""A job whose security setting needs another number of parties than the deployment has
is refused naming the settings that fit it, so the analyst knows what to pass."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest
from service_fakes import Stack, horizontal_setup, make_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("hint"))
    yield s
    s.close()


def test_a_security_setting_for_another_party_count_names_those_that_fit(stack: Stack) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4)
    body = {
        "dataset_ids": ids, "label_column": "label", "k": 2, "security": "active-4pc",
        "engine": "mp-spdz",
        "recipient_public_key": base64.b64encode(stack.keys["analyst-1"].box_public_key).decode(),
    }
    r = httpx.post(stack.gateway.url + "/v1/jobs/validate", json=body, timeout=30,
                   headers={"Authorization": f"Bearer {stack.token['analyst-1']}"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "active-4pc needs 4 parties; this deployment has 3" in detail, detail
    assert "choose passive-3pc or active-3pc (--security)" in detail, detail


def test_submit_help_says_which_security_fits_which_deployment(capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    from ppfs_cli.main import main

    with pytest.raises(SystemExit):
        main(["jobs", "submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "security setting (default passive-3pc)" in text
    assert "4 (with Dave) for active-4pc and passive-4pc" in text
