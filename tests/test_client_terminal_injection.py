"""What the client prints from the gateway cannot act on the terminal reading it.

A party's status texts (a job's error, each party's phase), the reason a party gave no
receipt, and every other field the gateway relays reach an analyst's or owner's terminal.
A corrupted party (or the gateway, which is not trusted) chooses them: none may move the
cursor, recolour, title the window, plant a hyperlink, reorder text, start a line of its
own that reads as the client's, or stop the command. Each shows as inert text."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from ppfs_cli.main import main
from ppfs_client import commands
from ppfs_client.progress import JobProgressView
from test_client_hostile_gateway import Server, answer

TOKEN = "tok-d41d8cd98f00b204e9800998ecf8427e"

# a forged second job line, a window title, a colour, a bidi override
ERROR = ("out of memory\nj-forged  succeeded  k=3 m=100 p=10 passive-3pc mp-spdz"
         "\x1b]0;owned\x07\x1b[32m\u202e")
# rich markup: a hyperlink, a colour, a closing tag that matches nothing
PHASE = "[link=https://evil.example/]sign in again[/link] [bold red]BLAMED[/] [/oops]\t\r"
# every escape a terminal acts on: CSI, OSC (title, hyperlink), a bare carriage return
ANSI = re.compile(r"\x1b|\r|\u202e|\x07")


def _job(state: str = "failed", phase: str = PHASE, error: str = ERROR) -> dict[str, Any]:
    return {
        "id": "j1", "state": state, "error": error, "k": 3, "m": 100, "p": 10,
        "security": "passive-3pc", "engine": "mp-spdz",
        "parties": [
            {"index": i, "name": name, "state": "running", "progress": 0.4, "phase": phase}
            for i, name in enumerate(("Alice", "Bob", "Carol"))
        ],
    }


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("PPFS_GATEWAY", "PPFS_TOKEN", "PPFS_KEY", "PPFS_DEPLOYMENT_CA", "PPFS_CA"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PPFS_TOKEN", TOKEN)


@pytest.mark.parametrize("argv", [["jobs", "list"], ["jobs", "show", "j1"]])
def test_a_partys_texts_stay_inert_on_their_own_lines(
    argv: list[str], clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job()
    gw = Server(answer(200, json.dumps([job] if argv[1] == "list" else job).encode()))
    try:
        assert main([*argv, "--gateway", gw.url]) == 0
    finally:
        gw.close()
    out, err = capsys.readouterr()
    assert err == "" and not ANSI.search(out), out
    lines = out.splitlines()
    # the job, its parties, its error: the forged job line is part of the error line
    assert len(lines) == 3, lines
    assert lines[0].startswith("j1  failed") and lines[2].startswith("  error: out of memory")
    assert "j-forged  succeeded" in lines[2] and "\\n" in lines[2]
    assert "[link=https://evil.example/]" in lines[1]  # shown as it is, not acted on


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_watch_shows_a_partys_phase_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # wide enough to show the whole phase
    term = Tty()
    view = JobProgressView(terminal=term)
    assert view.live
    last = view.follow(iter([_job("running"), _job("failed")]))
    assert last is not None and last["state"] == "failed"
    shown = term.getvalue()
    assert "\x1b]8;" not in shown  # no hyperlink
    assert "\x1b]0;" not in shown and "\x1b[1;31m" not in shown  # no title, no colour
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", shown)  # rich's own cursor moves
    assert "[link=https://evil.example/]sign in again[/link] [bold red]BLAMED[/] [/oops]" in text
    assert "\\t\\r" in text


def test_a_partys_reason_for_no_receipt_is_inert(capsys: pytest.CaptureFixture[str]) -> None:
    # why a party gave no receipt: its own words, relayed by the gateway
    commands._unconfirmed([("Bob", ERROR)], "may still hold your uploads of ds1",
                          "ppfs datasets withdraw ds1")
    out, err = capsys.readouterr()
    assert out == "" and not ANSI.search(err), err
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Bob: NOT confirmed: out of memory"), lines


def test_a_refusal_relaying_a_partys_words_is_one_error_line(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # the gateway names the party and relays its words (PartyRejected): they may be a lie
    detail = "Bob refused StartJob: bad k\nppfs: note: job j-forged submitted\x1b[2K"
    body = json.dumps({"type": "https://ppfs.dev/problems/party-rejected", "status": 422,
                       "title": "A party refused", "detail": detail, "instance": "/v1/jobs"})
    gw = Server(answer(422, body.encode(), "application/problem+json"))
    try:
        assert main(["jobs", "list", "--gateway", gw.url]) == 2
    finally:
        gw.close()
    out, err = capsys.readouterr()
    assert out == "" and not ANSI.search(err), err
    (line,) = err.splitlines()
    assert line.startswith("ppfs: error: A party refused (422): Bob refused StartJob: bad k\\n")


def test_a_selected_columns_name_cannot_add_a_rank(
    tmp_path: Any, clean_env: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Column names come from an owner's signed manifest. The gateway refuses hidden
    characters in them, but it is not trusted: parties sign what the owner signed. The
    analyst's listing of the selection keeps each name on its rank's line."""
    import numpy as np
    from ppfs_client.keys import ClientKeys
    from ppfs_client.sdk import GatewayClient, ResultSelection

    ClientKeys.generate("analyst-1").save(tmp_path / "analyst.key")
    forged = "age\n    2. income\x1b[8m"

    def fetch(self: GatewayClient, keys: ClientKeys, job_id: str) -> ResultSelection:
        return ResultSelection(job_id, [forged, "bmi"], np.array([0, 1]), 2, 3)

    monkeypatch.setattr(GatewayClient, "fetch_result", fetch)
    monkeypatch.setenv("PPFS_KEY", str(tmp_path / "analyst.key"))
    assert main(["result", "fetch", "j1", "--gateway", "http://127.0.0.1:9"]) == 0
    out, _ = capsys.readouterr()
    assert not ANSI.search(out), out
    lines = out.splitlines()
    assert lines == ["selected (best first):",
                     "    1. age\\n    2. income\\x1b[8m",
                     "    2. bmi"], lines
