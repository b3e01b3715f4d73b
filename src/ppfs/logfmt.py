"""Log output for the daemons: plain text lines, or one JSON object per line.

``PPFS_LOG_FORMAT=json`` (or ``--log-format json``) selects JSON. Each object has
``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``msg``, plus ``job_id``, ``party``
and ``dataset_id`` when the message names them (``job=... party=...``, the house
message style). Messages never carry a value, a token or a key by construction; as a
second line of defence the formatter blanks anything that looks like a bearer token
or a base64 key before it is written.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
import unicodedata
from typing import IO, Any

FORMAT_ENV = "PPFS_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

_FIELDS = (
    ("job_id", re.compile(r"\bjob=([A-Za-z0-9._-]{1,128})")),
    ("party", re.compile(r"\bparty=([A-Za-z0-9._-]{1,64})")),
    ("dataset_id", re.compile(r"\bdataset=([A-Za-z0-9._-]{1,128})")),
)
# "Bearer <anything>", and runs of 40+ base64/base64url characters with an upper-case
# letter, '+' or '=' in them: a 32-byte key in base64 is 43-44 characters, a
# token_urlsafe(32) token 43, and a random one of that length is all lower case with
# odds of about 1e-11; hex digests, ids and URL paths (lower case) stay readable.
_BEARER = re.compile(r"(?i)\bbearer\s+\S+")
_LONG_B64 = re.compile(r"[A-Za-z0-9+/_-]{40,}={0,2}")
_LOWER = re.compile(r"[a-z0-9/_-]+")


# control, format (bidi overrides, zero-width), surrogate, private-use, unassigned, line
# and paragraph separator characters
_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def inert(text: str) -> str:
    """``text`` with every hidden character (newline and tab too) written as an escape: a
    message quoting what a party or a client chose (a party's error, relayed by the
    gateway) stays one record's line and cannot act on the terminal that shows it."""
    return "".join(ch if unicodedata.category(ch) not in _HIDDEN
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _blank(found: re.Match[str]) -> str:
    text = found.group(0)
    return text if _LOWER.fullmatch(text) else "[redacted]"


def redact(text: str) -> str:
    """``text`` with bearer credentials and key-like base64 runs blanked."""
    text = _BEARER.sub("Bearer [redacted]", text)
    return _LONG_B64.sub(_blank, text)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        msg = inert(redact(record.getMessage()))  # redacted first: "Bearer\n..." too
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": msg,
        }
        for name, pattern in _FIELDS:
            value = getattr(record, name, None)
            if value is None and (found := pattern.search(msg)) is not None:
                value = found.group(1)
            if value is not None:
                out[name] = str(value)
        if record.exc_info and record.exc_info[0] is not None:
            # the exception's type only: its text may quote data
            out["exc_type"] = record.exc_info[0].__name__
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))

    def formatMessage(self, record: logging.LogRecord) -> str:
        # the message only: a traceback appended after it keeps its lines
        record.message = inert(redact(record.message))
        return super().formatMessage(record)


def log_format(choice: str | None = None) -> str:
    """``json`` or ``text``: the explicit choice, else ``$PPFS_LOG_FORMAT``, else text."""
    value = (choice or os.environ.get(FORMAT_ENV) or "text").strip().lower()
    return "json" if value == "json" else "text"


def configure_logging(
    choice: str | None = None, level: int = logging.INFO, stream: IO[str] | None = None
) -> str:
    """Send every logger (uvicorn's too, when it propagates) to ``stream`` in the chosen
    format; returns the format used."""
    fmt = log_format(choice)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return fmt
