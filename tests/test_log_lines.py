"""A daemon's log line says what its daemon wrote: text a party or a client chose (a
party's error or refusal, relayed into the gateway's messages) cannot start a line that
reads as another record, nor move the cursor, recolour or reorder what an operator's
terminal shows, in either log format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from ppfs.logfmt import configure_logging

# what a corrupted party reports as its error, as the gateway logs a job's failure
ERROR = ("out of memory\n2026-01-01 00:00:00,000 ppfs.gateway INFO [Gateway.Job] job=j2 "
         "succeeded\x1b[2K\r\u202e")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_relayed_text_stays_inert_in_one_log_line(fmt: str) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        configure_logging(fmt, stream=stream)
        logging.getLogger("ppfs.gateway").warning("[Gateway.Job] job=%s failed: %s", "j1",
                                                  f"Carol failed: {ERROR}")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    written = stream.getvalue()
    lines = written.splitlines()
    assert len(lines) == 1, lines
    for bad in ("\x1b", "\r", "\u202e"):
        assert bad not in written, written
    msg = json.loads(lines[0])["msg"] if fmt == "json" else lines[0]
    assert "failed: Carol failed: out of memory\\n2026-01-01" in msg, msg
    assert "succeeded\\x1b[2K\\r\\u202e" in msg, msg
    if fmt == "json":
        assert json.loads(lines[0])["job_id"] == "j1"


def test_a_credential_split_by_a_newline_is_still_redacted() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        for fmt in ("text", "json"):
            configure_logging(fmt, stream=stream)
            logging.getLogger("ppfs.gateway").warning("said: %s", "Bearer\nsecret-token-1")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    written = stream.getvalue()
    assert "secret-token-1" not in written and written.count("Bearer [redacted]") == 2, written
