"""A gateway that does not answer is named where it was looked for, in one line, without
the URL's user part, path or query."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from ppfs_cli.main import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_unreachable_gateway_is_named(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _closed_port()
    monkeypatch.setenv("PPFS_GATEWAY", f"http://someone:pw@127.0.0.1:{port}/base?x=1")
    monkeypatch.setenv("PPFS_TOKEN", "t0ken-value-for-the-test")
    rc = main(["jobs", "list"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("ppfs: error: gateway unreachable (0): "), err
    assert f"at http://127.0.0.1:{port} (PPFS_GATEWAY or --gateway)" in err[0], err
    for hidden in ("someone", "pw", "/base", "x=1", "t0ken"):
        assert hidden not in err[0], err
