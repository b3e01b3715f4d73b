"""The gateway's resource limits and log hygiene, on a real `ppfs gateway serve` process.

- Unauthenticated requests are answered 401 before their body is read: three 250 MB
  bodies at once leave the gateway's memory where it was.
- A credential in a query string is refused and appears in no log.
- The state directory and the registry are the gateway's alone; accepted bodies are
  spooled to a private file that is gone afterwards. A second gateway on the same state
  directory is refused at once.
- Request methods nobody defined add no metric series; no page loads script from elsewhere
  (no Swagger UI or ReDoc), the OpenAPI document stays.
"""

from __future__ import annotations

import contextlib
import json
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from service_fakes import FakeCluster, make_stack, tokens

BODY = 250_000_000
IDLE_SLACK = 200 << 20


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path
    state_dir: Path
    token: str

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    cluster = FakeCluster(3, tmp_path)  # its PKI only: these requests never reach a party
    cfg, by = tokens(("admin", "admin"))
    settings = cluster.gateway_settings(tmp_path / "gateway", cfg)
    config = tmp_path / "gateway.json"
    # tokens are written as given (the settings' dump hides them)
    config.write_text(json.dumps({**json.loads(settings.model_dump_json()), "tokens": cfg}))
    port_file, log = tmp_path / "port", tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ppfs_cli", "gateway", "serve", "--config", str(config),
             "--port", "0", "--port-file", str(port_file)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        port = int(port_file.read_text())
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/healthz").status_code == 200
        yield GatewayProcess(proc, url, port, log, settings.state_dir, by["admin"])
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _post_big(port: int, headers: dict[str, str], result: dict[str, object],
              path: str = "/v1/datasets") -> None:
    """POST a 250 MB body, reading the answer while sending; record what came back."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {BODY}\r\n{head}\r\n").encode())
    reply = bytearray()

    def read() -> None:
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                reply.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    chunk = b"x" * (1 << 20)
    sent = 0
    try:
        while sent < BODY and not reply:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the gateway closed the connection: it stopped reading
    reader.join(60)
    sock.close()
    result["sent"] = sent
    result["reply"] = bytes(reply)


def test_unauthenticated_bodies_are_refused_unread(gateway: GatewayProcess) -> None:
    idle = gateway.rss()
    peak = idle
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, gateway.rss())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    results: list[dict[str, object]] = [{} for _ in range(3)]
    headers = [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic eDp5"}]
    threads = [threading.Thread(target=_post_big, args=(gateway.port, h, r))
               for h, r in zip(headers, results, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    time.sleep(0.5)
    stop.set()
    sampler.join()
    for r in results:
        reply = r["reply"]
        assert isinstance(reply, bytes) and reply.startswith(b"HTTP/1.1 401"), reply[:200]
        assert b"application/problem+json" in reply and b"www-authenticate: bearer" in reply.lower()
        assert int(r["sent"]) < BODY  # type: ignore[call-overload]
    assert peak - idle < IDLE_SLACK, (idle, peak)
    assert gateway.rss() - idle < IDLE_SLACK
    # the gateway still serves
    ok = httpx.get(gateway.url + "/v1/datasets",
                   headers={"Authorization": f"Bearer {gateway.token}"})
    assert ok.status_code == 200


def _largest_spooled(spool: Path, send: Callable[[], None]) -> int:
    """The largest file in ``spool`` while ``send`` runs (sampled every 10 ms)."""
    seen = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal seen
        while not stop.is_set():
            with contextlib.suppress(OSError):
                seen = max([seen, *(f.stat().st_size for f in spool.iterdir())])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        send()
    finally:
        stop.set()
        watcher.join()
    return seen


def test_bodies_outside_the_api_are_refused_unread(gateway: GatewayProcess) -> None:
    """Bodies are taken under /v1/ only, after the token: a body sent anywhere else, with
    no token, is answered 404 at once and never read into memory or onto disk."""
    for path in ("/healthz", "/v1", "//v1/datasets", "/console/x"):
        result: dict[str, object] = {}
        seen = _largest_spooled(gateway.state_dir / "spool",
                                lambda: _post_big(gateway.port, {}, result, path))  # noqa: B023
        reply = result["reply"]
        assert isinstance(reply, bytes) and reply.startswith(b"HTTP/1.1 404"), (path, reply[:200])
        assert int(result["sent"]) < BODY, path  # type: ignore[call-overload]
        assert seen < 1 << 20, (path, seen)  # nothing of it spooled


def test_query_string_token_is_refused_and_never_logged(gateway: GatewayProcess) -> None:
    auth = {"Authorization": f"Bearer {gateway.token}"}
    for path, headers in [
        (f"/v1/datasets?token={gateway.token}", {}),
        (f"/v1/datasets?kind=data&access_token={gateway.token}", auth),
        (f"/healthz?api_key={gateway.token}", {}),
    ]:
        r = httpx.get(gateway.url + path, headers=headers)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert body["type"].endswith("/token-in-query") and "query string" in body["detail"]
        assert gateway.token not in r.text
    # a harmless query string still works, and still reaches the access log without it
    assert httpx.get(gateway.url + "/v1/datasets?kind=mask", headers=auth).status_code == 200
    time.sleep(0.3)
    log = gateway.log.read_text(errors="replace")
    assert "GET /v1/datasets" in log  # the access log is on
    assert gateway.token not in log
    assert "?" not in "".join(line for line in log.splitlines() if "GET /" in line)
    for f in gateway.state_dir.rglob("*"):
        if f.is_file():
            assert gateway.token.encode() not in f.read_bytes(), f


def test_second_gateway_on_the_state_dir_is_refused(gateway: GatewayProcess) -> None:
    config = gateway.log.parent / "gateway.json"  # the fixture's
    second = subprocess.run(
        [sys.executable, "-m", "ppfs_cli", "gateway", "serve", "--config", str(config),
         "--port", "0"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    err = second.stderr.strip().splitlines()
    assert second.returncode == 1 and len(err) == 1, second.stderr
    assert str(gateway.state_dir) in err[0] and "in use by another process" in err[0]
    assert f"pid {gateway.proc.pid}" in err[0]
    assert gateway.proc.poll() is None  # the first one serves on, untouched
    assert httpx.get(gateway.url + "/healthz").status_code == 200


def _method_labels(gateway: GatewayProcess) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(gateway.url + "/metrics",
                  headers={"Authorization": f"Bearer {gateway.token}"})
    assert r.status_code == 200
    return {s.labels["method"] for fam in text_string_to_metric_families(r.text)
            for s in fam.samples if "method" in s.labels}


def test_unknown_methods_add_no_metric_series(gateway: GatewayProcess) -> None:
    with httpx.Client() as http:
        for i in range(20):
            assert http.request(f"X{i:06d}", gateway.url + "/v1/jobs").status_code in (401, 405)
        http.request("get", gateway.url + "/healthz")  # a method is case-sensitive
    labels = _method_labels(gateway)
    assert labels <= {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other"}
    assert "other" in labels and "GET" in labels


def test_no_docs_page_shares_the_consoles_origin(gateway: GatewayProcess) -> None:
    """The console keeps its token in the origin's session storage: no page there loads
    script from elsewhere (Swagger UI and ReDoc come from a CDN)."""
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(gateway.url + path).status_code == 404, path
    r = httpx.get(gateway.url + "/openapi.json")
    assert r.status_code == 200 and r.json()["info"]["title"] == "ppfs dealer-gateway"
    assert "default-src 'none'" in r.headers["content-security-policy"]


def _emptied(spool: Path) -> bool:
    """The spool holds no body once the request is over (removed just after the reply)."""
    deadline = time.monotonic() + 10
    while any(spool.iterdir()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_state_dir_and_registry_are_private(gateway: GatewayProcess) -> None:
    assert stat.S_IMODE(gateway.state_dir.stat().st_mode) == 0o700
    registry = gateway.state_dir / "registry.sqlite3"
    assert registry.exists() and stat.S_IMODE(registry.stat().st_mode) == 0o600
    # an accepted body goes through the spool and leaves nothing behind
    r = httpx.post(gateway.url + "/v1/datasets", content=b"{" + b" " * (3 << 20),
                   headers={"Authorization": f"Bearer {gateway.token}",
                            "Content-Type": "application/json"})
    assert r.status_code == 422
    spool = gateway.state_dir / "spool"
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700
    assert _emptied(spool)
    r = httpx.post(gateway.url + "/v1/datasets", json={"name": "spooled", "owner_id": "owner-x"},
                   headers={"Authorization": f"Bearer {gateway.token}"})
    assert r.status_code == 201 and r.json()["name"] == "spooled", r.text
    assert _emptied(spool)


def test_authenticated_body_over_the_cap_is_refused(tmp_path: Path) -> None:
    s = make_stack(tmp_path, max_upload_bytes=1 << 20)
    try:
        auth = {"Authorization": f"Bearer {s.token['admin']}"}

        def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is found while reading
            for _ in range(4):
                yield b" " * (1 << 19)

        r = httpx.post(s.gateway.url + "/v1/datasets", content=chunks(), headers=auth)
        assert r.status_code == 413 and r.json()["type"].endswith("/too-large")
        assert _emptied(tmp_path / "gateway" / "spool")
        r = httpx.post(s.gateway.url + "/v1/datasets", content=b"x" * (2 << 20),
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    finally:
        s.close()


def test_dev_stack_logs_are_private(tmp_path: Path) -> None:
    import asyncio

    from ppfs_cli.devstack import Stack as DevStack
    from ppfs_cli.devstack import StackLayout

    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    (logs / "old.log").write_text("from an earlier run\n")
    (logs / "old.log").chmod(0o644)
    stack = DevStack(StackLayout(tmp_path, 3))

    async def spawn(name: str) -> int:
        proc = await stack._spawn(name, [sys.executable, "-c", "print('hello')"])
        return await proc.wait()

    assert asyncio.run(spawn("new")) == 0
    assert asyncio.run(spawn("old")) == 0
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    for name in ("new", "old"):
        log = logs / f"{name}.log"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert "hello" in log.read_text()
