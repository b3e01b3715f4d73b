"""schemathesis against the gateway's own OpenAPI document, on a live server (uvicorn,
port 0) in front of fake parties: no generated request may cause a server error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from service_fakes import Stack, horizontal_setup, make_stack

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402

EXAMPLES = 20


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("schemathesis"))
    horizontal_setup(s, m=12, p=4)  # some state for ids to hit
    yield s
    s.close()


def test_no_server_error(live: Stack) -> None:
    schema = schemathesis.openapi.from_url(live.gateway.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 10
    checked = 0
    for op in operations:
        if op.path.endswith("/events"):
            continue  # a stream that lasts as long as the job; covered by the service tests

        @given(case=op.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def run(case: Any) -> None:
            for subject in ("admin", "owner-a", "analyst-1", None):
                headers = {"Authorization": f"Bearer {live.token[subject]}"} if subject else {}
                case.call_and_validate(
                    base_url=live.gateway.url,
                    headers=headers,
                    checks=[not_a_server_error],
                    timeout=30,
                )

        run()
        checked += 1
    assert checked == len(operations) - 1
