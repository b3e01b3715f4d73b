"""The console shows what a party writes (its phase, its error, and the job's reason
built from it) as inert text: no markup is read from it (everything goes in as text,
never as HTML), and no bidirectional override, zero-width or control character in it
can reorder or hide what the console writes next to it ("reported by Carol").

The gateway refuses such characters in the names people give (data sets, columns,
labels, classes); a party's status texts are relayed as the party wrote them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_fakes import Stack, horizontal_setup, make_stack

from ppfs.v1 import party_pb2 as pb

# reverses what follows it; a zero-width space; a line separator; markup
PHASE = "ranking\u202e \u200bdone<img src=x onerror=alert(1)>\u2028"
# the input checks failed, says Carol, and she would have "reported by Carol" unreadable
ERROR = "Bob altered its share\u202e"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path)
    s.cluster.hold = True  # the parties run the job until released
    try:
        yield s
    finally:
        s.loop.loop.call_soon_threadsafe(s.cluster.release.set)
        s.close()


def test_a_partys_texts_show_inert_in_the_console(held: Stack, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    s, d = held, browser
    _, ids, _ = horizontal_setup(s, m=20, p=4)
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2)
    deadline = time.monotonic() + 10
    while analyst.get_job(job["id"])["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)

    async def corrupt() -> None:  # Carol fails, with a hostile phase and reason
        s.cluster.parties[2].set(job["id"], state=pb.JOB_STATE_FAILED, phase=PHASE,
                                 error=ERROR, failure=pb.FAILURE_KIND_INTEGRITY)

    s.loop.run(corrupt())
    deadline = time.monotonic() + 30
    while (got := analyst.get_job(job["id"]))["state"] != "failed":
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    assert ERROR in got["error"] and got["error"].index(ERROR) < got["error"].index("Carol")

    wait = WebDriverWait(d, 30)
    d.get(s.gateway.url + "/console/")
    wait.until(ec.visibility_of_element_located((By.ID, "token")))
    d.find_element(By.ID, "token").send_keys(s.token["analyst-1"])
    d.find_element(By.ID, "signin-button").click()
    wait.until(ec.visibility_of_element_located((By.ID, "nav")))
    d.get(s.gateway.url + f"/console/#/jobs/{job['id']}")
    d.refresh()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".bar-row[data-party=Carol]")))

    def text(css: str) -> str:
        return str(d.find_element(By.CSS_SELECTOR, css).get_attribute("textContent"))

    phase = text(".bar-row[data-party=Carol] .bar-phase")
    assert phase == "ranking\\u202e \\u200bdone<img src=x onerror=alert(1)>\\u2028", phase
    assert d.find_elements(By.CSS_SELECTOR, "#view img") == []  # no markup read from it
    reason = text(".job-head .error")
    assert "Bob altered its share\\u202e (reported by Carol" in reason, reason
    assert text(".bar-row[data-party=Carol] .error") == "Bob altered its share\\u202e"


def test_a_party_cannot_show_itself_under_another_partys_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployment status names each party as the gateway is configured (its index
    is the party's place); a party that reports another name is shown under its own,
    with the name it claims as its problem, not as a second "Alice"."""
    import httpx
    from service_fakes import FakeParty

    real = FakeParty.GetIdentity

    async def impostor(self: FakeParty, request: object, context: object) -> pb.PartyIdentity:
        ident = await real(self, request, context)
        if self.index == 2:  # Carol says she is Alice
            ident.name = "Alice"
        return ident

    monkeypatch.setattr(FakeParty, "GetIdentity", impostor)
    s = make_stack(tmp_path)
    try:
        r = httpx.get(s.gateway.url + "/v1/deployment/status",
                      headers={"Authorization": f"Bearer {s.token['analyst-1']}"}, timeout=30)
        assert r.status_code == 200, r.text
        got = r.json()
        assert [p["name"] for p in got["parties"]] == ["Alice", "Bob", "Carol"], got
        carol = got["parties"][2]
        assert "reports the name 'Alice'" in carol["problem"] and got["healthy"] is False
    finally:
        s.close()


def test_a_partys_oversized_identity_fields_are_bounded_in_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a party states of its software (version, engines, engine versions, MPC host)
    reaches every console poll: a party that states megabytes of it, or thousands of
    engines, is shown in a bounded answer, never echoed whole."""
    import httpx
    from service_fakes import FakeParty

    real = FakeParty.GetIdentity
    huge = "v" * 1_000_000

    async def bloated(self: FakeParty, request: object, context: object) -> pb.PartyIdentity:
        ident = await real(self, request, context)
        if self.index == 1:
            ident.software_version = huge
            ident.mpc_host = "h" * 100_000
            del ident.engines[:]
            ident.engines.extend(f"engine-{i}-" + "e" * 1000 for i in range(1000))
            for i in range(1000):
                ident.engine_versions[f"engine-{i}" + "k" * 500] = huge[:10_000]
        return ident

    monkeypatch.setattr(FakeParty, "GetIdentity", bloated)
    s = make_stack(tmp_path)
    try:
        r = httpx.get(s.gateway.url + "/v1/deployment/status",
                      headers={"Authorization": f"Bearer {s.token['analyst-1']}"}, timeout=30)
        assert r.status_code == 200, r.text[:300]
        assert len(r.content) < 64_000, len(r.content)
        bob = r.json()["parties"][1]
        assert bob["software_version"].startswith("vvv") and len(bob["software_version"]) <= 64
        assert 0 < len(bob["engines"]) <= 8 and all(len(e) <= 64 for e in bob["engines"])
        assert 0 < len(bob["engine_versions"]) <= 8
        assert len(bob["mpc_address"]) <= 300
        alice = r.json()["parties"][0]  # an ordinary party is shown whole
        assert alice["engines"] == ["mp-spdz", "mpyc"]
    finally:
        s.close()
