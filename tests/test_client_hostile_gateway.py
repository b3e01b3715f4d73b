"""The data owner's and analyst's client against a gateway that answers garbage, a user
that gives it garbage, and a client process killed mid-command.

The gateway is not trusted: whatever it sends (not JSON, the wrong shape, a redirect,
an endless or dripping body, an endless event line) ends in one error line naming the
problem, with no traceback and no token, and nothing kept as if it had succeeded. A
client killed while it submits keeps what it needs to open the job's result as the
answer to the request it signed; a submission the gateway says created no job is not
left pending, and a gateway that says so falsely cannot have that job's result opened."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ppfs_cli.main import main
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import (
    MAX_ANSWER_BYTES,
    ApiError,
    GatewayClient,
    RefusedAnswer,
    ResultRejected,
)
from service_fakes import horizontal_setup, make_stack, run_cli, wait_final

from ppfs.errors import ParameterError

TOKEN = "tok-d41d8cd98f00b204e9800998ecf8427e"
ANCHOR = "ab" * 32  # a fingerprint: the deployment is refused before keys matter

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


class Server:
    """A gateway of the test's making, on a free local port."""

    def __init__(self, handle: Handler) -> None:
        self.hits: list[str] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            body = b""

            def _any(self) -> None:
                outer.hits.append(f"{self.command} {self.path}")
                n = int(self.headers.get("Content-Length") or 0)
                self.body = self.rfile.read(n) if n else b""
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    handle(self)

            do_GET = do_POST = _any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(status: int, body: bytes, ctype: str = "application/json",
           **headers: str) -> Handler:
    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.end_headers()
        h.wfile.write(body)

    return handle


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("PPFS_GATEWAY", "PPFS_TOKEN", "PPFS_KEY", "PPFS_DEPLOYMENT_CA", "PPFS_CA"):
        monkeypatch.delenv(k, raising=False)


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ppfs: error: "), err
    return lines[0]


GARBAGE = {
    "html": answer(200, b"<html>welcome</html>", "text/html"),
    "empty": answer(200, b""),
    "list-for-object": answer(200, b"[1, 2, 3]"),
    "object-for-list": answer(200, b'{"id": "x"}'),
    "fields-missing": answer(200, b'[{"id": "x"}]'),
    "wrong-types": answer(200, json.dumps([{
        "id": 5, "name": [], "owner_id": {}, "rows": "many", "columns": 7,
        "label_column": 3, "classes": 9, "state": 1, "parties": "Alice", "k": None,
        "m": None, "p": None, "security": 0, "engine": 0, "error": 0}]).encode()),
    "deep-nesting": answer(200, b"[" * 200_000 + b"]" * 200_000),
    "problem-not-an-object": answer(500, b'["title", "detail"]'),
    "status-1xx-like": answer(299, b"not json"),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
@pytest.mark.parametrize("argv", [
    ["datasets", "list"], ["jobs", "list"], ["jobs", "show", "j1"],
    ["deployment", "--deployment-ca", ANCHOR],
])
def test_garbage_answers_end_in_one_line(
    kind: str, argv: list[str], clean_env: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gw = Server(GARBAGE[kind])
    monkeypatch.setenv("PPFS_TOKEN", TOKEN)
    try:
        rc = main([*argv, "--gateway", gw.url])
    finally:
        gw.close()
    out, err = capsys.readouterr()
    assert rc in (1, 2) and out == "", (kind, argv, out, err)
    line = one_error_line(err)
    assert "Traceback" not in line and TOKEN not in out + err


def test_a_redirect_is_refused_and_the_token_goes_nowhere(
    clean_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = Server(answer(200, b"[]"))
    gw = Server(answer(302, b"", Location=f"{elsewhere.url}/v1/datasets?kind=data"))
    monkeypatch.setenv("PPFS_TOKEN", TOKEN)
    try:
        rc = main(["datasets", "list", "--gateway", gw.url])
    finally:
        gw.close()
        elsewhere.close()
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert "redirected" in one_error_line(err) and TOKEN not in err
    assert elsewhere.hits == []  # the bearer token never left for the other place


def test_an_endless_answer_is_not_read_whole() -> None:
    pulled = [0]
    chunk = b" " * (1 << 20)

    def endless() -> Iterator[bytes]:
        for _ in range(4 * (MAX_ANSWER_BYTES // len(chunk))):  # the old client: all of it
            pulled[0] += len(chunk)
            yield chunk
        raise AssertionError("the client read four times the most it should")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            return httpx.Response(200, content=endless())
        return httpx.Response(200, headers={"Content-Length": str(1 << 40)},
                              content=iter([b"["]))

    with GatewayClient("http://gw", TOKEN, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(RefusedAnswer, match="longer than"):
            c.list_jobs()
        assert pulled[0] <= MAX_ANSWER_BYTES + len(chunk)
        with pytest.raises(RefusedAnswer, match="bytes long"):  # said so up front
            c.list_datasets()


def test_an_endless_event_line_is_refused() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        def stream() -> Iterator[bytes]:
            yield b"event: job\ndata: {"
            for _ in range(64):
                yield b'"x": 1, ' * (1 << 15)  # 256 KiB, never a newline
            raise AssertionError("the client read an event line of 16 MiB")

        return httpx.Response(200, content=stream(),
                              headers={"Content-Type": "text/event-stream"})

    with (GatewayClient("http://gw", TOKEN, transport=httpx.MockTransport(handler)) as c,
          pytest.raises(RefusedAnswer, match="event line longer")):
        list(c.events("j1"))


def test_a_dripping_answer_ends_at_the_timeout() -> None:
    def drip(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(40):  # a byte every 0.25 s: no read ever waits a whole second
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.25)

    gw = Server(drip)
    try:
        with GatewayClient(gw.url, TOKEN, timeout=1.0) as c:
            t0 = time.monotonic()
            with pytest.raises(ApiError) as info:
                c.list_jobs()
            assert time.monotonic() - t0 < 4  # not the 10 s the gateway drips for
            assert "too slow" in str(info.value) and TOKEN not in str(info.value)
    finally:
        gw.close()


def test_a_token_is_never_printed_and_a_command_line_token_is_warned_of(
    clean_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = Server(answer(200, b"[]"))
    try:
        secret = "t\u00f6ken-" + TOKEN  # no HTTP header can carry it
        monkeypatch.setenv("PPFS_TOKEN", secret)
        assert main(["datasets", "list", "--gateway", gw.url]) == 2
        out, err = capsys.readouterr()
        assert "printable ASCII" in one_error_line(err) and secret not in out + err
        assert TOKEN not in err
        monkeypatch.delenv("PPFS_TOKEN")
        assert main(["datasets", "list", "--gateway", gw.url, "--token", TOKEN]) == 0
        out, err = capsys.readouterr()
        assert "visible to other users" in err and "PPFS_TOKEN" in err and TOKEN not in err
        assert gw.hits == ["GET /v1/datasets?kind=data"]  # the token: in the header only
    finally:
        gw.close()


def test_an_unreadable_ca_bundle_is_one_line(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PPFS_TOKEN", TOKEN)
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    for ca in (tmp_path / "missing.pem", bad):
        assert main(["datasets", "list", "--gateway", "https://127.0.0.1:1", "--ca",
                     str(ca)]) == 2
        assert str(ca) in one_error_line(capsys.readouterr().err)


def test_a_key_file_others_can_read_is_refused(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "me.key"
    ClientKeys.generate("owner-a").save(key)
    assert main(["keys", "show", "--key", str(key)]) == 0
    capsys.readouterr()
    for mode in (0o644, 0o640, 0o604, 0o620):
        key.chmod(mode)
        assert main(["keys", "show", "--key", str(key)]) == 2
        out, err = capsys.readouterr()
        line = one_error_line(err)
        assert str(key) in line and f"chmod 600 {key}" in line and out == ""
    key.chmod(0o600)
    assert main(["keys", "show", "--key", str(key)]) == 0


def test_damaged_mask_words_are_named_as_this_machines_file(tmp_path: Path) -> None:
    keys = ClientKeys.generate("analyst-1").save(tmp_path / "me.key")
    path = keys.save_mask_words("m1", np.arange(8, dtype=np.int64).reshape(4, 2))
    assert keys.load_mask_words("m1").shape == (4, 2)
    whole = path.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"garbage", whole[:10]):
        path.write_bytes(damaged)
        with pytest.raises(ParameterError, match="not the mask words this client wrote"):
            keys.load_mask_words("m1")


def test_kept_secrets_are_synced_with_their_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file, mask words and a kept request outlive a crash of the machine: the file
    is synced, and so is the folder that names it (and a folder made for it)."""
    synced: set[tuple[int, int]] = set()
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    from ppfs.contract import SignedRequest

    keys = ClientKeys.generate("analyst-1").save(tmp_path / "k" / "me.key")
    masks = keys.save_mask_words("m1", np.zeros((2, 2), dtype=np.int64))
    kept = keys.save_job_request("j1", SignedRequest(b"asked", b"sig"))
    assert kept is not None
    for p in (tmp_path / "k" / "me.key", masks, kept):
        for q in (p, p.parent, p.parent.parent):
            st = q.stat()
            assert (st.st_dev, st.st_ino) in synced, q


class KillingProxy(Server):
    """Relays to the gateway; once the gateway has answered ``POST /v1/jobs`` it kills
    the client process (SIGKILL) before that answer reaches it."""

    def __init__(self, upstream: str) -> None:
        self.victim = 0
        self.killed = threading.Event()

        def relay(h: Any) -> None:
            headers = {k: v for k, v in h.headers.items()
                       if k.lower() in ("authorization", "content-type")}
            r = httpx.request(h.command, upstream + h.path, headers=headers, content=h.body,
                              timeout=60)
            if h.command == "POST" and h.path == "/v1/jobs":
                os.kill(self.victim, signal.SIGKILL)
                self.killed.set()
                return  # the answer never reaches it
            h.send_response(r.status_code)
            h.send_header("Content-Type", r.headers.get("content-type", "application/json"))
            h.send_header("Content-Length", str(len(r.content)))
            h.end_headers()
            h.wfile.write(r.content)

        super().__init__(relay)


def test_submit_killed_before_its_job_id_is_kept_still_binds_the_result(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ppfs jobs submit` killed after the gateway took the job, before the job id came
    back: the masks and the signed request are on disk; the next submit says what
    happened; `ppfs result fetch` opens the job's result, checked against the request
    the parties signed that it ran, and keeps that request as the job's."""
    s = make_stack(tmp_path / "stack")
    proxy = KillingProxy(s.gateway.url)
    try:
        t, ids, _ = horizontal_setup(s)
        key = s.keys["analyst-1"].path
        assert key is not None
        env = dict(os.environ, PPFS_GATEWAY=proxy.url, PPFS_TOKEN=s.token["analyst-1"],
                   PPFS_KEY=str(key), PPFS_DEPLOYMENT_CA=str(s.ca_pem))
        submit = ["jobs", "submit", "--dataset", ids[0], "--dataset", ids[1],
                  "--label", t.label_column, "--k", "2", "--engine", "mpyc"]
        proc = subprocess.Popen([sys.executable, "-m", "ppfs_cli", *submit], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proxy.victim = proc.pid
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        assert proxy.killed.is_set()

        analyst = s.client("analyst-1")
        jobs = analyst.list_jobs()
        assert len(jobs) == 1  # the gateway took it; the client never learnt its id
        job_id = jobs[0]["id"]
        assert wait_final(analyst, job_id)["state"] == "succeeded"
        assert not (key.parent / f"{key.name}.jobs" / f"{job_id}.json").exists()

        monkeypatch.setenv("PPFS_GATEWAY", s.gateway.url)
        monkeypatch.setenv("PPFS_TOKEN", s.token["analyst-1"])
        monkeypatch.setenv("PPFS_KEY", str(key))
        monkeypatch.setenv("PPFS_DEPLOYMENT_CA", str(s.ca_pem))
        # the next submit names what happened (and submits its own job)
        assert main([*submit]) == 0
        err = capsys.readouterr().err
        assert "got no job id back" in err and "ppfs result fetch JOB_ID" in err

        assert main(["result", "fetch", job_id, "--json"]) == 0, capsys.readouterr().err
        got = json.loads(capsys.readouterr().out)
        assert got["job_id"] == job_id and len(got["selected"]) == 2
        # bound now: the request the parties signed they ran as this job, kept as its own
        kept = s.keys["analyst-1"].load_job_request(job_id)
        assert kept is not None
        asked = json.loads(kept.statement)
        assert asked["dataset_ids"] == ids and asked["k"] == 2
        assert asked["mask_upload_id"] == jobs[0]["mask_upload_id"]
        assert s.keys["analyst-1"].pending_requests() == []
    finally:
        proxy.close()
        s.close()


NO_JOB_ID = "got no job id back"


def submit_argv(t: Any, ids: list[str], mask_upload_id: str) -> list[str]:
    return ["jobs", "submit", "--dataset", ids[0], "--dataset", ids[1], "--label",
            t.label_column, "--k", "2", "--engine", "mpyc", "--mask-upload", mask_upload_id]


def test_a_submit_the_parties_refuse_leaves_no_pending_request(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str],
) -> None:
    """`jobs submit --mask-upload` (no validation call first) while a party is down: the
    gateway answers 502 stating that no job was created, so the signed request is not
    left waiting for a job id, and the next submit says nothing of one."""
    s = make_stack(tmp_path / "stack", party_rpc_seconds=2.0)
    try:
        t, ids, _ = horizontal_setup(s)
        analyst, keys = s.client("analyst-1"), s.keys["analyst-1"]
        masks = [analyst.create_masks(keys, 2) for _ in range(2)]
        s.loop.run(s.cluster.stop_party(2))
        rc, _, err = run_cli(capsys, s, "analyst-1", *submit_argv(t, ids, masks[0]))
        assert rc != 0 and "(502)" in err and "no job was submitted" in err, err
        assert analyst.list_jobs() == []
        assert keys.pending_requests() == []
        # the statement the client went by: a structured field of the problem details
        body = dict(job_body_of(t, ids, masks[1]), request=None)
        r = httpx.post(s.gateway.url + "/v1/jobs", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {s.token['analyst-1']}"})
        assert r.status_code == 502, r.text
        assert r.json()["job_created"] is False
        assert r.json()["no_job_reason"] == "party-unavailable"

        s.loop.run(s.cluster.start_party(2))
        rc, out, err = run_cli(capsys, s, "analyst-1", *submit_argv(t, ids, masks[1]))
        assert rc == 0, err
        assert NO_JOB_ID not in err
        assert wait_final(analyst, out.strip())["state"] == "succeeded"
    finally:
        s.close()


def job_body_of(t: Any, ids: list[str], mask_upload_id: str) -> dict[str, Any]:
    return {"dataset_ids": ids, "combination": "horizontal", "label_column": t.label_column,
            "k": 2, "security": "passive-3pc", "engine": "mpyc",
            "mask_upload_id": mask_upload_id,
            "recipient_public_key": base64.b64encode(bytes(32)).decode()}


class LyingProxy(Server):
    """Relays to the gateway; answers ``POST /v1/jobs`` with ``status`` and ``problem``
    instead of the gateway's answer, after the gateway took the job when ``forward``."""

    def __init__(self, upstream: str, status: int, problem: dict[str, Any] | None,
                 forward: bool) -> None:
        def relay(h: Any) -> None:
            headers = {k: v for k, v in h.headers.items()
                       if k.lower() in ("authorization", "content-type")}
            lie = h.command == "POST" and h.path == "/v1/jobs"
            if lie and not forward:
                r = None
            else:
                r = httpx.request(h.command, upstream + h.path, headers=headers,
                                  content=h.body, timeout=60)
            if lie:
                body = json.dumps(problem).encode() if problem is not None else b"Bad Gateway"
                ctype = "application/problem+json" if problem is not None else "text/plain"
                answer(status, body, ctype)(h)
                return
            assert r is not None
            answer(r.status_code, r.content,
                   r.headers.get("content-type", "application/json"))(h)

        super().__init__(relay)


def test_a_gateway_that_says_no_job_was_created_yet_runs_one_gains_nothing(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client drops its pending request on the gateway's word that no job was
    created. A gateway that lies (runs the job all the same) cannot have that job's
    result opened: the request is kept as refused, and the result the parties signed as
    its answer is refused; nor can it pass the job off as a later submission's."""
    s = make_stack(tmp_path / "stack")
    lie = {"type": "https://ppfs.dev/problems/party-unavailable", "status": 502,
           "title": "A computing party did not answer", "detail": "Carol did not answer",
           "job_created": False, "no_job_reason": "party-unavailable"}
    proxy = LyingProxy(s.gateway.url, 502, lie, forward=True)
    try:
        t, ids, _ = horizontal_setup(s)
        analyst, keys = s.client("analyst-1"), s.keys["analyst-1"]
        masks = [analyst.create_masks(keys, 2) for _ in range(2)]
        monkeypatch.setattr(s.gateway, "url", proxy.url)
        rc, _, err = run_cli(capsys, s, "analyst-1", *submit_argv(t, ids, masks[0]))
        assert rc != 0 and "(502)" in err, err
        assert keys.pending_requests() == []
        jobs = analyst.list_jobs()
        assert len(jobs) == 1  # it lied: the job runs
        job_id = jobs[0]["id"]
        assert wait_final(analyst, job_id)["state"] == "succeeded"
        rc, _, err = run_cli(capsys, s, "analyst-1", "result", "fetch", job_id)
        assert rc != 0 and "said no job was created" in one_error_line(err), err
        assert keys.load_job_request(job_id) is None
        # nor as the answer to the next request this key signs (the gateway answers that
        # submission with this job's id)
        keys.save_job_request(job_id, _next_request(s, t, ids, masks[1]))
        with pytest.raises(ResultRejected, match="another request"):
            analyst.fetch_result(keys, job_id)
    finally:
        proxy.close()
        s.close()


def _next_request(s: Any, t: Any, ids: list[str], mask_upload_id: str) -> Any:
    """A request this key signs as a later submission's (what a lying gateway would
    answer with the earlier job's id)."""
    from ppfs.contract import JobRequest

    keys = s.keys["analyst-1"]
    return JobRequest(
        recipient=keys.subject, recipient_public_key=keys.box_public_key,
        mask_upload_id=mask_upload_id, dataset_ids=tuple(ids), combination="horizontal",
        label_column=t.label_column, k=2, security="passive-3pc", engine="mpyc",
        scorer="ms-gini", training=None,
    ).sign(keys.signing)


@pytest.mark.parametrize("status", [502, 503])
@pytest.mark.parametrize("problem", [None, {"title": "Bad Gateway", "status": 0}],
                         ids=["plain", "problem-without-statement"])
def test_a_5xx_that_does_not_say_keeps_the_pending_request(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, status: int, problem: dict[str, Any] | None,
) -> None:
    """A 502/503 that does not state that no job was created (a proxy's error page, a
    crashed gateway) may hide a job: the signed request stays kept, and the next submit
    says so, in words true of it."""
    s = make_stack(tmp_path / "stack")
    if problem is not None:
        problem = dict(problem, status=status)
    proxy = LyingProxy(s.gateway.url, status, problem, forward=False)
    try:
        t, ids, _ = horizontal_setup(s)
        analyst, keys = s.client("analyst-1"), s.keys["analyst-1"]
        masks = [analyst.create_masks(keys, 2) for _ in range(2)]
        monkeypatch.setattr(s.gateway, "url", proxy.url)
        rc, _, err = run_cli(capsys, s, "analyst-1", *submit_argv(t, ids, masks[0]))
        assert rc != 0 and f"({status})" in err, err
        assert len(keys.pending_requests()) == 1
        rc, _, err = run_cli(capsys, s, "analyst-1", *submit_argv(t, ids, masks[1]))
        assert NO_JOB_ID in err and "did not say whether" in err, err
        assert len(keys.pending_requests()) == 2
    finally:
        proxy.close()
        s.close()
