"""The operator's view against a real local stack (`ppfs up`: three party daemons and the
gateway as processes, JSON logs): Prometheus metrics move with a job, logs hold no
token, key or value, and the web console (headless Chromium driven by Selenium) signs
in, shows three healthy parties and a data set's schema, and follows a job submitted
through the SDK to succeeded with one progress bar per party."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import owner_table

from ppfs import oracle
from ppfs.contract import Reveal
from ppfs.engines.registry import get_engine
from ppfs.synthetic import make_table

pytest.importorskip("ppfs_party.server", reason="the party daemon (ppfs_party) is not built")

# screenshots go to $PPFS_SCREENSHOT_DIR (the README's come from PPFS_SCREENSHOT_DIR=docs),
# else to the test's temporary directory
SHOTS_ENV = "PPFS_SCREENSHOT_DIR"
M, P, K = 24, 5, 2


def _engine() -> str:
    return "mp-spdz" if get_engine("mp-spdz").unavailable_reason() is None else "mpyc"


@dataclass
class UpStack:
    root: Path
    url: str
    metrics: dict[str, str]
    tokens: dict[str, str]
    proc: subprocess.Popen[str]

    def client(self, subject: str):
        from ppfs_client.sdk import GatewayClient

        from ppfs.keycert import TrustAnchor

        # the development CA is the clients' trust anchor (out of band)
        return GatewayClient(self.url, self.tokens[subject],
                             trust=TrustAnchor.parse(str(self.root / "ca" / "ca.pem")))

    def keys(self, subject: str):
        from ppfs_client.keys import ClientKeys

        return ClientKeys.load(self.root / "keys" / f"{subject}.key")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpStack]:
    root = tmp_path_factory.mktemp("console") / "stack"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PPFS_LOG_FORMAT="json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppfs_cli", "up", "--state-dir", str(root), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line:
                break
            lines.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "Ctrl-C" in text, text + (proc.stderr.read() if proc.poll() is not None else "")
        url = next(w for w in text.split() if w.startswith("http://"))
        metrics_line = next(ln for ln in lines if ln.strip().startswith("metrics"))
        found = re.findall(r"(\w+) (http://\S+/metrics)", metrics_line)
        metrics = {name: u.rstrip(",") for name, u in found}
        assert set(metrics) == {"alice", "bob", "carol", "gateway"}, metrics_line
        assert f"{url}/console/" in text
        entries = json.loads((root / "tokens.json").read_text())
        yield UpStack(root, url, metrics, {e["subject"]: e["token"] for e in entries}, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _upload(s: UpStack, name: str, seed: int) -> tuple[str, object]:
    t = make_table(M, P, seed=seed)
    a, admin = s.client("owner-a"), s.client("admin")
    ds = a.create_dataset(name)
    a.upload_table(s.keys("owner-a"), owner_table(t), ds["id"])
    admin.grant(ds["id"], "analyst")
    # selection and model: the watched job trains, so it stays running while the page loads
    a.consent(s.keys("owner-a"), ds["id"], "analyst", s.keys("analyst").box_public_key,
              Reveal.MODEL)
    return ds["id"], t


def _submit(s: UpStack, ds_id: str, engine: str | None = None,
            training: dict[str, float] | None = None) -> str:
    job = s.client("analyst").submit(
        s.keys("analyst"), [ds_id], label="label", k=K, security="passive-3pc",
        engine=engine or _engine(), training=training,
    )  # fmt: skip
    return str(job["id"])


def _wait(s: UpStack, job_id: str, timeout: float = 300) -> dict:
    c = s.client("analyst")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = c.get_job(job_id)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def _check_result(s: UpStack, job_id: str, t) -> None:
    got = s.client("analyst").fetch_result(s.keys("analyst"), job_id)
    assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, K).tolist()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _secrets(s: UpStack, *tables) -> list[str]:
    """Every token, private key (in the forms it is stored in) and data value."""
    found = list(s.tokens.values())
    for f in (s.root / "keys").glob("*.key"):
        d = json.loads(f.read_text())
        for k in ("signing_key", "box_key"):
            raw = base64.b64decode(d[k])
            found += [d[k], raw.hex(), base64.urlsafe_b64encode(raw).decode().rstrip("=")]
    for key_file in (s.root / "parties").rglob("*.key"):
        body = key_file.read_bytes()
        if b"PRIVATE KEY" in body:
            pem = body.decode().split("-----")[2].strip().replace("\n", "")
            found.append(pem[:40])
    for t in tables:
        found += [repr(float(v)) for v in np.asarray(t.x).ravel()]
    return found


def test_metrics_move_with_a_job_and_json_logs_hold_no_secret(up: UpStack) -> None:
    gw = up.metrics["gateway"]
    # /metrics on the API listener: admins only
    assert httpx.get(up.url + "/metrics").status_code == 401
    analyst = {"Authorization": f"Bearer {up.tokens['analyst']}"}
    assert httpx.get(up.url + "/metrics", headers=analyst).status_code == 403
    admin = {"Authorization": f"Bearer {up.tokens['admin']}"}
    r = httpx.get(up.url + "/metrics", headers=admin)
    assert r.status_code == 200 and "ppfs_gateway_jobs_finished" in r.text
    before = _samples(httpx.get(gw).text)
    party_before = {n: _samples(httpx.get(up.metrics[n]).text) for n in ("alice", "bob", "carol")}

    ds_id, t = _upload(up, "metrics-clinic", seed=5)
    job_id = _submit(up, ds_id)
    job = _wait(up, job_id)
    assert job["state"] == "succeeded", job
    _check_result(up, job_id, t)

    after = _samples(httpx.get(gw).text)
    api_after = _samples(httpx.get(up.url + "/metrics", headers=admin).text)

    def delta(name: str, **labels: str) -> float:
        return _get(after, name, **labels) - _get(before, name, **labels)

    engine = _engine()
    assert delta("ppfs_gateway_jobs_submitted_total", engine=engine, security="passive-3pc") == 1
    assert delta("ppfs_gateway_jobs_finished_total", state="succeeded", failure_kind="") == 1
    assert delta("ppfs_gateway_job_duration_seconds_count", state="succeeded") == 1
    assert delta("ppfs_gateway_job_duration_seconds_sum", state="succeeded") > 0
    assert delta("ppfs_gateway_job_phase_duration_seconds_count", phase="queued") == 1
    assert delta("ppfs_gateway_job_phase_duration_seconds_count", phase="running") == 1
    assert delta("ppfs_gateway_job_party_engine_seconds_count", party="0") == 1
    sent = sum(p["bytes_sent"] for p in job["parties"])
    assert delta("ppfs_gateway_job_bytes_sent_count") == (1 if sent else 0)
    assert delta("ppfs_gateway_job_bytes_sent_sum") == sent
    # the data upload and the analyst's mask upload
    assert delta("ppfs_gateway_upload_requests_total", outcome="accepted") == 2
    assert delta("ppfs_gateway_upload_request_bytes_count") == 2
    assert delta("ppfs_gateway_upload_request_bytes_sum") > 1000
    assert _get(after, "ppfs_gateway_jobs", state="succeeded") >= 1
    # refusals by reason: the two refused scrapes above (no token, not an admin)
    assert _get(api_after, "ppfs_gateway_refusals_total", status="401", reason="unauthenticated")
    assert _get(api_after, "ppfs_gateway_refusals_total", status="403", reason="forbidden")
    route = "/v1/jobs/{job_id}"
    assert _get(after, "ppfs_gateway_http_requests_total", method="GET", route=route, status="200")

    for name, old in party_before.items():
        new = _samples(httpx.get(up.metrics[name]).text)

        def pdelta(metric: str, new=new, old=old, **labels: str) -> float:
            return _get(new, metric, **labels) - _get(old, metric, **labels)

        assert pdelta("ppfs_party_jobs_finished_total", state="succeeded", failure_kind="") == 1
        assert pdelta("ppfs_party_job_duration_seconds_count", state="succeeded") == 1
        for phase in ("assembling inputs", "compiling", "waiting for the engine", "engine"):
            assert pdelta("ppfs_party_job_phase_duration_seconds_count", phase=phase) == 1, phase
        assert pdelta("ppfs_party_uploads_total") == 2
        assert pdelta("ppfs_party_upload_bytes_sum") > 1000
        assert _get(new, "ppfs_party_jobs", state="succeeded") >= 1
        assert _get(new, "ppfs_party_info", party=name.capitalize(), version="0.1.0") == 1

    # JSON logs: every line one object; the job is named by id; nothing secret anywhere
    secrets = _secrets(up, t)
    mentions = 0
    for log in sorted((up.root / "logs").glob("*.log")):
        text = log.read_text()
        for line in text.splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            assert {"ts", "level", "logger", "msg"} <= rec.keys(), line
            mentions += rec.get("job_id") == job_id
        for s in secrets:
            assert s not in text, f"{log.name} holds a secret"
    assert mentions >= 4  # gateway and every party log the job with its id


# ------------------------------------------------------------------------- browser

def _shot(driver, where: Path, name: str) -> None:
    """Save a screenshot of the whole page (height fitted to the content)."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": 1280, "height": max(600, min(int(height), 1600)),
               "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    where.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(where / name))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_console_follows_a_job_without_exposing_the_token(
    up: UpStack, browser, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    shots = Path(os.environ[SHOTS_ENV]) if os.environ.get(SHOTS_ENV) else tmp_path
    wait = WebDriverWait(d, 30)
    token = up.tokens["analyst"]
    ds_id, t = _upload(up, "clinic-north", seed=9)

    # headers: a strict CSP, no framing, no sniffing
    r = httpx.get(up.url + "/console/")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in r.text and " style=" not in r.text  # no inline script or style

    d.get(up.url + "/console")
    wait.until(ec.visibility_of_element_located((By.ID, "token")))
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.ID, "signin-button").click()

    # overview: three reachable parties with engines, versions and fingerprints
    wait.until(lambda drv: len(drv.find_elements(By.CSS_SELECTOR, ".party .status-ok")) == 3)
    cards = d.find_elements(By.CSS_SELECTOR, ".party")
    assert [c.get_attribute("data-party") for c in cards] == ["Alice", "Bob", "Carol"]
    for c in cards:
        assert "Reachable" in c.text and "0.1.0" in c.text and _engine() in c.text
        assert len(c.find_elements(By.CSS_SELECTOR, ".fps dd")) == 3
    assert d.find_element(By.ID, "who-subject").text == "analyst"
    _shot(d, shots, "console-overview.png")

    # a data set's public schema
    d.find_element(By.CSS_SELECTOR, "a[data-route=datasets]").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f"tr[data-id='{ds_id}']")))
    d.find_element(By.CSS_SELECTOR, f"tr[data-id='{ds_id}'] a").click()
    wait.until(ec.presence_of_element_located((By.ID, "schema")))
    rows = d.find_elements(By.CSS_SELECTOR, "#schema tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == list(t.columns)
    assert "label" in d.find_element(By.CSS_SELECTOR, ".kv").text
    _shot(d, shots, "console-dataset.png")

    # the jobs page, then a job submitted through the SDK appears and is followed live
    d.find_element(By.CSS_SELECTOR, "a[data-route=jobs]").click()
    wait.until(ec.presence_of_element_located((By.ID, "jobs-box")))
    # MPyC with training (Step 2B): a run long enough that the console sees it running
    # however long submitting took on a loaded machine
    submitted: list[str] = []
    training = {"epochs": 15, "batch_size": 4, "learning_rate": 0.5}
    worker = threading.Thread(
        target=lambda: submitted.append(_submit(up, ds_id, "mpyc", training)))
    worker.start()
    worker.join(120)
    job_id = submitted[0]
    WebDriverWait(d, 30).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f"tr[data-id='{job_id}'] a"))
    )
    d.find_element(By.CSS_SELECTOR, f"tr[data-id='{job_id}'] a").click()
    # the page redraws as events arrive: read it in one script call, not element by element
    bars_js = (
        "return [...document.querySelectorAll('.bar-row')].map(r => [r.dataset.party, "
        "r.dataset.state, r.querySelector('.bar').getAttribute('aria-valuenow')])"
    )
    wait.until(lambda drv: len(drv.execute_script(bars_js)) == 3)
    running_shot = False
    bars: list[list[str]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        bars = d.execute_script(bars_js)
        states = [b[1] for b in bars]
        if not running_shot and "running" in states and "succeeded" not in states:
            assert d.execute_script("return !!document.getElementById('cancel')")
            _shot(d, shots, "console-job-running.png")
            running_shot = True
        if states == ["succeeded"] * 3:
            break
        time.sleep(0.2)
    assert running_shot, "the console never showed the job running"
    assert bars == [[n, "succeeded", "100"] for n in ("Alice", "Bob", "Carol")]
    badge_js = "return document.querySelector('.job-title .badge').textContent"
    WebDriverWait(d, 10).until(lambda drv: drv.execute_script(badge_js) == "succeeded")
    assert d.find_element(By.ID, "fetch-cmd").text == f"ppfs result fetch {job_id}"
    assert not d.find_elements(By.ID, "cancel")  # nothing to cancel once final
    _shot(d, shots, "console-job.png")
    _check_result(up, job_id, t)

    # the token is in no page, URL, request URL or log; no result was ever requested
    assert token not in d.page_source and token not in d.current_url
    urls = []
    for entry in d.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    assert any("/v1/jobs/" + job_id + "/events" in u for u in urls), (len(urls), urls[-5:])
    assert not any(token in u for u in urls)
    assert not any(u.endswith("/result") for u in urls)
    assert not [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    for asset in ("", "console.js", "console.css"):
        body = httpx.get(f"{up.url}/console/{asset}").text
        assert all(s not in body for s in _secrets(up, t))
    for log in (up.root / "logs").glob("*.log"):
        assert token not in log.read_text()
