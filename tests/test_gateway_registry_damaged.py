"""The gateway's registry damaged on disk (truncated, overwritten, corrupted): the gateway
refuses to start, naming the file, in one line (exit 1), and leaves the file as it is,
instead of failing its start with a traceback and exit status 0, or running on a part
of its records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ppfs_gateway.errors import RegistryUnreadable
from ppfs_gateway.registry import Registry


def _registry(path: Path) -> bytes:
    """A registry with a few records, closed; its bytes."""
    r = Registry(path)
    for i in range(40):
        r.create_dataset(f"d{i}", "study " * 20, "owner-a", "data")
    r.close()
    for leftover in path.parent.glob(path.name + "-*"):  # WAL files merged on close
        assert leftover.stat().st_size == 0 or leftover.name.endswith("-shm")
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "page corrupted"])
def test_a_damaged_registry_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "registry.sqlite3"
    whole = _registry(path)
    assert len(whole) >= 4 * 4096
    damaged = {
        "truncated": whole[: len(whole) // 2],
        "overwritten": b"not a database" * 100,
        # a b-tree page's header overwritten: the file opens, its records do not read
        "page corrupted": whole[:2 * 4096] + bytes([0xFF] * 64) + whole[2 * 4096 + 64:],
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(RegistryUnreadable, match=r"registry .*registry\.sqlite3 cannot be read"):
        Registry(path)
    assert path.read_bytes() == damaged  # left as it was, for the operator to restore
    path.write_bytes(whole)  # restored: every record is back
    restored = Registry(path)
    assert len(restored.list_datasets()) == 40
    restored.close()


def test_gateway_serve_on_a_damaged_registry_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "registry.sqlite3").write_bytes(b"not a database" * 100)
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({
        "state_dir": str(state),
        "parties": [{"address": f"127.0.0.1:{5000 + i}", "tls_server_name": n}
                    for i, n in enumerate(("alice", "bob", "carol"))],
        "tls": {"ca_cert": "ca.pem", "client_cert": "gateway.pem", "client_key": "gateway.key"},
        "tokens": [{"token": "t" * 43, "role": "admin", "subject": "admin"}],
    }))
    r = subprocess.run([sys.executable, "-m", "ppfs_cli", "gateway", "serve", "--config",
                        str(config), "--port", "0"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("ppfs gateway serve: error: the registry ")
    assert "registry.sqlite3 cannot be read" in lines[0] and "restore it" in lines[0]
    assert "t" * 43 not in r.stderr + r.stdout
