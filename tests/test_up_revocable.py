"""`ppfs up` signs the parties' key statements revocable and serves a fresh list.

A new state directory's party key statements ask clients for the CA's revocation list
(``ppfs pki sign --revocable``) and are on the CA's record (``ppfs pki revoke --ca-dir
STATE/ca`` names them); the list is issued afresh at every start into ``ca/`` and, while
the stack runs, again a day after its last issue. A state directory made before keeps
its statements as they were signed. (tests/test_up_supervises.py runs ``ppfs up`` with
them: a client refuses such statements unless the gateway serves the list.)
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from ppfs_cli.devstack import REFRESH_WITHIN, Stack, prepare

from ppfs.engines.base import PARTY_NAMES
from ppfs.keycert import KeyStatement, statement_sha256
from ppfs.pki import load_ca
from ppfs.revocation import REVOCATIONS_FILE, current_list, recorded


def _statements(root: Path) -> list[bytes]:
    return [(root / "parties" / f"p{i}-{n.lower()}" / "certs" / "party-keys.json").read_bytes()
            for i, n in enumerate(PARTY_NAMES[:3])]


def test_a_new_state_dir_gets_revocable_statements_and_a_fresh_list(tmp_path: Path) -> None:
    root = tmp_path / "st"
    prepare(root, 3, revocable=True)
    statements = _statements(root)
    assert all(KeyStatement.from_bytes(st).revocation_list for st in statements)
    assert sorted(r.sha256 for r in recorded(root / "ca")) == sorted(
        statement_sha256(st) for st in statements)
    ca = load_ca(root / "ca")
    first = current_list(root / "ca", ca)
    assert first is not None and first.revoked == ()
    now = dt.datetime.now(dt.UTC)
    assert first.stale_after - now > dt.timedelta(days=6, hours=23)
    # started again: the same statements, the list issued afresh (strictly later)
    prepare(root, 3, revocable=True)
    assert _statements(root) == statements
    again = current_list(root / "ca", ca)
    assert again is not None and again.issued > first.issued


def test_the_running_stack_issues_the_list_again_a_day_on(tmp_path: Path) -> None:
    root = tmp_path / "st"
    stack = Stack(prepare(root, 3, revocable=True))
    ca = load_ca(root / "ca")
    first = current_list(root / "ca", ca)
    assert first is not None
    assert stack.refresh_revocations(first.issued + dt.timedelta(hours=23)) is False
    assert current_list(root / "ca", ca) == first
    later = first.stale_after - REFRESH_WITHIN + dt.timedelta(minutes=1)
    assert stack.refresh_revocations(later) is True
    now = current_list(root / "ca", ca)
    assert now is not None and now.issued == later.replace(microsecond=0)
    assert now.stale_after - now.issued == dt.timedelta(days=7)


def test_a_state_dir_made_before_keeps_its_statements(tmp_path: Path) -> None:
    root = tmp_path / "st"
    prepare(root, 3)  # as before: statements without the flag, no list
    statements = _statements(root)
    assert not any(KeyStatement.from_bytes(st).revocation_list for st in statements)
    assert not (root / "ca" / REVOCATIONS_FILE).exists()
    assert Stack(prepare(root, 3)).refresh_revocations() is False  # nothing to refresh
    prepare(root, 3, revocable=True)
    assert _statements(root) == statements  # trusted as before
    assert (root / "ca" / REVOCATIONS_FILE).is_file()


def test_a_list_that_is_not_the_cas_is_named(tmp_path: Path) -> None:
    from ppfs.errors import ParameterError

    root = tmp_path / "st"
    prepare(root, 3, revocable=True)
    (root / "ca" / REVOCATIONS_FILE).write_bytes(b"{}")
    with pytest.raises(ParameterError, match=REVOCATIONS_FILE):
        prepare(root, 3, revocable=True)


def test_a_refresh_that_fails_in_any_way_leaves_the_stack_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CA key encrypted at rest while the stack runs (it cannot sign unattended): the
    refresh fails with the library's TypeError, not an OSError or ValueError. `ppfs up`
    warns and keeps supervising, rather than ending (and every daemon with it)."""
    import asyncio

    from cryptography.hazmat.primitives import serialization

    root = tmp_path / "st"
    stack = Stack(prepare(root, 3, revocable=True))
    ca = load_ca(root / "ca")
    (root / "ca" / "ca.key").write_bytes(ca.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"a passphrase")))
    with pytest.raises(TypeError):  # the fault itself, as the refresh meets it
        stack.refresh_revocations(dt.datetime.now(dt.UTC) + dt.timedelta(days=2))
    capsys.readouterr()
    asyncio.run(stack._refresh_reporting())
    err = capsys.readouterr().err
    assert "ppfs: warning: the revocation list was not issued again" in err, err
    assert "a passphrase" not in err
