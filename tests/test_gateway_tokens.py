"""Bearer tokens with an end, a warning before it, and rotation without a restart.

- A token past its ``expires_at`` is refused with 401 saying it expired and when, never
  the token, its hash or whose it was; a valid token beside it still works.
- A token ending within 30 days is logged at start and shown to an admin in
  /v1/deployment/status (by role and subject; no token anywhere); the metrics give each
  role's soonest end, for alerts.
- A malformed ``expires_at`` in the tokens file stops the start, naming the field and the
  entry, never a token.
- ``ppfs gateway serve`` reads its tokens file again on SIGHUP: a new token works and a
  removed one is refused, same process; a request that arrived before the reload ends
  as it began. A tokens file that does not parse, or where two principals share a
  token, is refused as a whole on reload: the tokens in force stay, the problem is
  logged.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ppfs_gateway.core.config import load_settings, read_tokens_file
from service_fakes import FakeCluster, GatewayThread, LoopThread, tokens

from ppfs.errors import ParameterError

NOW = dt.datetime.now(dt.UTC)


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _leaks(text: str, secrets: list[str]) -> list[str]:
    """Which of ``secrets`` (or their SHA-256, hex) appear in ``text``."""
    return [s for s in secrets
            if s in text or hashlib.sha256(s.encode()).hexdigest() in text]


def _at(entry: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(entry["expires_at"]).timestamp()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.contextmanager
def _gateway(tmp_path: Path, cfg: list[dict[str, Any]]) -> Iterator[GatewayThread]:
    loop = LoopThread()
    cluster = FakeCluster(3, tmp_path)
    loop.run(cluster.start())
    gw = GatewayThread(cluster.gateway_settings(tmp_path / "gateway", cfg))
    try:
        yield gw
    finally:
        gw.stop()
        loop.run(cluster.stop())
        loop.stop()


def test_an_expired_token_is_refused_naming_its_end_and_a_valid_one_beside_it_works(
    tmp_path: Path,
) -> None:
    cfg, by = tokens(("analyst", "kasimir"), ("admin", "root"))
    cfg[0]["expires_at"] = "2020-01-31T00:00:00Z"
    cfg[1]["expires_at"] = _iso(NOW + dt.timedelta(days=365))
    with _gateway(tmp_path, cfg) as gw:
        answers = []
        for method, path, body in (("GET", "/v1/principal", None),
                                   ("POST", "/v1/jobs/validate", b"{}")):
            r = httpx.request(method, gw.url + path, headers=_bearer(by["kasimir"]),
                              content=body)
            answers.append(r.text)
            assert r.status_code == 401, (path, r.text)
            p = r.json()
            assert p["type"].endswith("/token-expired"), p
            assert "expired on 2020-01-31 00:00 UTC" in p["detail"], p
            assert "kasimir" not in r.text, r.text  # not whose it was
        ok = httpx.get(gw.url + "/v1/principal", headers=_bearer(by["root"]))
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"role": "admin", "subject": "root"}
        assert not _leaks("\n".join(answers), [by["kasimir"]])


def test_tokens_ending_at_the_same_time_are_listed_by_role_and_subject() -> None:
    """Two tokens with one end (a batch issued together): both are named, in a fixed
    order, and the gateway's start does not trip over comparing them."""
    from ppfs_gateway.auth import Principal, _Known, ending_lines
    from ppfs_gateway.core.config import Role

    now = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    end = now + dt.timedelta(days=3)
    lines = ending_lines([_Known(Principal(Role.DATA_OWNER, "zoe"), end),
                          _Known(Principal(Role.ANALYST, "ana"), end),
                          _Known(Principal(Role.DATA_OWNER, "bea"), end)], now)
    assert [ln.split(" expires")[0] for ln in lines] == [
        "the analyst token of ana", "the data_owner token of bea", "the data_owner token of zoe"]


def test_a_token_ending_within_30_days_is_logged_and_shown_to_an_admin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ppfs.gateway")
    cfg, by = tokens(("admin", "root"), ("analyst", "ana"), ("data_owner", "olga"))
    cfg[1]["expires_at"] = _iso(NOW + dt.timedelta(days=10, hours=1))  # within 30 days
    cfg[2]["expires_at"] = _iso(NOW + dt.timedelta(days=60))  # not yet
    with _gateway(tmp_path, cfg) as gw:
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        soon = [line for line in logged if "token of ana expires on" in line]
        assert len(soon) == 1 and "the analyst token of ana" in soon[0], logged
        assert "(in 10 days)" in soon[0] and "SIGHUP" in soon[0], soon
        assert not [line for line in logged if "olga" in line], logged

        admin = httpx.get(gw.url + "/v1/deployment/status", headers=_bearer(by["root"]))
        assert admin.status_code == 200, admin.text
        shown = [w for w in admin.json()["warnings"] if "token of" in w]
        assert len(shown) == 1 and shown[0].startswith("the analyst token of ana expires on"), (
            admin.json()["warnings"])
        # another principal is not told whose tokens end
        ana = httpx.get(gw.url + "/v1/deployment/status", headers=_bearer(by["ana"]))
        assert ana.status_code == 200, ana.text
        assert not [w for w in ana.json()["warnings"] if "token" in w], ana.json()
        # for alerts: per role, the soonest end (no subject, no token)
        scraped = httpx.get(gw.url + "/metrics", headers=_bearer(by["root"]))
        assert scraped.status_code == 200, scraped.text
        ends = {line.split('"')[1]: float(line.split()[-1]) for line in scraped.text.splitlines()
                if line.startswith("ppfs_gateway_token_expiry_timestamp_seconds{")}
        assert ends == {"analyst": _at(cfg[1]), "data_owner": _at(cfg[2])}, ends
        assert not [x for x in ("root", "ana", "olga") if f'"{x}"' in scraped.text]
        answers = admin.text + ana.text + scraped.text
    assert not _leaks(caplog.text + answers, list(by.values()))


def test_a_malformed_end_in_the_tokens_file_is_named_by_field_and_entry(
    tmp_path: Path,
) -> None:
    cfg, by = tokens(("admin", "root"), ("analyst", "ana"))
    cluster = FakeCluster(3, tmp_path)  # its PKI only
    settings = cluster.gateway_settings(tmp_path / "gateway", cfg)
    config = tmp_path / "gateway.json"
    body = json.loads(settings.model_dump_json(exclude={"tokens", "tokens_file"}))
    config.write_text(json.dumps({**body, "tokens_file": "tokens.json"}))
    for bad in ("31/01/2027", "2027-03-01T00:00:00", 1800000000, "2027-02-30T00:00:00Z"):
        cfg[1]["expires_at"] = bad
        (tmp_path / "tokens.json").write_text(json.dumps(cfg))
        with pytest.raises(ParameterError) as err:
            load_settings(config, env={})
        msg = str(err.value)
        assert "tokens file entry 2 of 2: invalid expires_at" in msg, (bad, msg)
        assert "2027-01-31T00:00:00Z" in msg, msg  # what it should look like
        assert not _leaks(msg, list(by.values())) and str(bad) not in msg, msg
    cfg[1]["expires_at"] = "2027-01-31T01:00:00+01:00"  # any zone, held as UTC
    (tmp_path / "tokens.json").write_text(json.dumps(cfg))
    loaded = load_settings(config, env={})
    assert loaded.tokens[1].expires_at == dt.datetime(2027, 1, 31, tzinfo=dt.UTC)
    assert loaded.tokens[0].expires_at is None
    assert loaded.tokens_file == tmp_path / "tokens.json"


def test_an_end_beyond_what_utc_can_hold_is_named_by_field_and_entry(tmp_path: Path) -> None:
    """A time that exists in its own zone but not in UTC (year 9999 west of Greenwich,
    year 1 east of it) is a malformed end like any other: named by field and entry, not
    a traceback at start, nor an error that cuts a SIGHUP reload short."""
    cfg, by = tokens(("admin", "root"), ("analyst", "ana"))
    for bad in ("9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+01:00"):
        cfg[1]["expires_at"] = bad
        (tmp_path / "tokens.json").write_text(json.dumps(cfg))
        with pytest.raises(ParameterError) as err:
            read_tokens_file(tmp_path / "tokens.json")
        msg = str(err.value)
        assert "tokens file entry 2 of 2: invalid expires_at" in msg, (bad, msg)
        assert not _leaks(msg, list(by.values())) and bad not in msg, msg


# -- rotation on SIGHUP, on a real `ppfs gateway serve` ---------------------------------


class _Served:
    def __init__(self, tmp_path: Path, cfg: list[dict[str, Any]]) -> None:
        cluster = FakeCluster(3, tmp_path)  # its PKI only: no request here reaches a party
        settings = cluster.gateway_settings(tmp_path / "gateway", cfg)
        self.tokens_file = tmp_path / "tokens.json"
        self.write(cfg)
        config = tmp_path / "gateway.json"
        body = json.loads(settings.model_dump_json(exclude={"tokens", "tokens_file"}))
        config.write_text(json.dumps({**body, "tokens_file": "tokens.json"}))
        port_file, self.log = tmp_path / "port", tmp_path / "gateway.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ppfs_cli", "gateway", "serve", "--config", str(config),
                 "--port", "0", "--port-file", str(port_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    def write(self, entries: Any) -> None:
        tmp = self.tokens_file.with_name("tokens.json.tmp")
        tmp.write_text(entries if isinstance(entries, str) else json.dumps(entries))
        os.replace(tmp, self.tokens_file)  # as an operator's editor or tooling would

    def hup(self, expect: str) -> None:
        """SIGHUP, then wait for the log line that says what came of it."""
        seen = self.log.read_text().count(expect)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while self.log.read_text().count(expect) <= seen:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def who(self, token: str) -> int:
        return httpx.get(self.url + "/v1/principal", headers=_bearer(token)).status_code

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[_Served, list[dict[str, Any]], dict[str, str]]]:
    cfg, by = tokens(("admin", "root"), ("data_owner", "olga"))
    s = _Served(tmp_path, cfg)
    try:
        yield s, cfg, by
    finally:
        s.close()


def _begin_post(port: int, path: str, token: str, body: bytes, sent: int) -> socket.socket:
    """A request whose headers and the first ``sent`` bytes of its body are on their way."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    sock.sendall(head + body[:sent])
    return sock


def _finish(sock: socket.socket, rest: bytes) -> tuple[int, bytes]:
    sock.sendall(rest)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


def test_sighup_adds_and_removes_tokens_without_a_restart(
    served: tuple[_Served, list[dict[str, Any]], dict[str, str]],
) -> None:
    s, cfg, by = served
    pid = s.proc.pid
    assert s.who(by["olga"]) == 200 and s.who(by["root"]) == 200
    # olga's request is under way (authenticated, its body still arriving) when her
    # token is taken out
    body = json.dumps({"name": "survey", "kind": "data"}).encode()
    inflight = _begin_post(s.port, "/v1/datasets", by["olga"], body, 5)
    time.sleep(0.3)
    new, new_by = tokens(("analyst", "ana"))
    s.write([cfg[0], *new])
    s.hup("tokens reloaded")
    status, answer = _finish(inflight, body[5:])
    assert status == 201, answer
    assert json.loads(answer)["owner_id"] == "olga"

    assert s.who(new_by["ana"]) == 200  # added
    gone = httpx.get(s.url + "/v1/principal", headers=_bearer(by["olga"]))
    assert gone.status_code == 401 and gone.json()["type"].endswith("/unauthenticated")
    assert s.who(by["root"]) == 200  # kept
    assert s.proc.pid == pid and s.proc.poll() is None  # no restart
    log = s.log.read_text()
    assert "tokens reloaded" in log and "1 added, 1 removed" in log, log
    assert not _leaks(log, [*by.values(), *new_by.values()]), log


def test_a_tokens_file_that_does_not_parse_on_reload_keeps_the_tokens_in_force(
    served: tuple[_Served, list[dict[str, Any]], dict[str, str]],
) -> None:
    s, cfg, by = served
    new, new_by = tokens(("analyst", "ana"))
    broken_end = [cfg[0], {**new[0], "expires_at": "next tuesday"}]
    shared = [*cfg, {**new[0], "token": cfg[1]["token"]}]  # two principals, one token
    for broken, named in ((broken_end, "tokens file entry 2 of 2: invalid expires_at"),
                          (shared, "two principals share a token"),
                          ('[{"token": ', "cannot read the tokens file")):
        s.write(broken)
        s.hup("tokens not reloaded")
        last = [line for line in s.log.read_text().splitlines() if "tokens not reloaded" in line]
        assert named in last[-1] and "the tokens in force stay" in last[-1], last[-1]
        # the old table, whole: both old tokens, not the new one
        assert (s.who(by["root"]), s.who(by["olga"]), s.who(new_by["ana"])) == (200, 200, 401)
    log = s.log.read_text()
    assert not _leaks(log, [*by.values(), *new_by.values()]), log
    s.write([*cfg, *new])  # once it parses, it is taken
    s.hup("tokens reloaded")
    assert (s.who(by["root"]), s.who(by["olga"]), s.who(new_by["ana"])) == (200, 200, 200)


# -- a job's event stream outlives the request that opened it ------------------------------


def _stream_closes(url: str, token: str, job_id: str, within: float) -> tuple[bool, str]:
    """Watch the job's events with ``token``: (whether the stream closed within
    ``within`` seconds, what it sent)."""
    got = ""
    t0 = time.monotonic()
    timeout = httpx.Timeout(5.0, read=within + 20)
    with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers=_bearer(token),
                      timeout=timeout) as resp:
        assert resp.status_code == 200, resp.read()
        for chunk in resp.iter_text():
            got += chunk
            if time.monotonic() - t0 > within:
                return False, got
    return time.monotonic() - t0 <= within, got


def test_a_job_event_stream_closes_once_its_token_ends_or_is_removed(tmp_path: Path) -> None:
    """A job watched for hours (a job held running) stops streaming once the token that
    opened the watch ends or a reload removes it: the token's end and its removal reach
    long-lived connections too, not only the requests after them."""
    from service_fakes import horizontal_setup, make_stack

    s = make_stack(tmp_path)
    try:
        _, ids, _ = horizontal_setup(s)
        ends, removed = tokens(("analyst", "analyst-1"), ("analyst", "analyst-1"))[0]
        ends["expires_at"] = _iso(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=8))
        tokens_file = tmp_path / "tokens.json"
        tokens_file.write_text(json.dumps([*s.token_config, ends, removed]))
        s.token_config = [*s.token_config, ends, removed]
        s.restart_gateway(tokens_file=str(tokens_file))
        s.cluster.hold = True
        analyst = s.client("analyst-1")
        job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2)
        opened_at = time.monotonic()
        closed, got = _stream_closes(s.gateway.url, ends["token"], job["id"], 14)
        assert "event: job" in got and "event: end" not in got, got
        assert closed and time.monotonic() - opened_at >= 5, "streamed past the token's end"
        # the other one: removed by a reload while the stream runs
        table = s.gateway.server.config.app.state.tokens
        tokens_file.write_text(json.dumps([*s.token_config[:-2]]))
        threading.Timer(2.0, table.reload).start()
        closed, got = _stream_closes(s.gateway.url, removed["token"], job["id"], 2 + 18)
        assert "event: job" in got and "event: end" not in got, got
        assert closed, "streamed on with a token a reload removed"
        assert analyst.get_job(job["id"])["state"] in ("queued", "running")
    finally:
        s.loop.loop.call_soon_threadsafe(s.cluster.release.set)
        s.close()
