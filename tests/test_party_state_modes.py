"""Another user of a party's machine reads nothing of its state: a state directory
that was already there with open modes (restored from a backup by a plain copy, made
by hand under the usual umask) is narrowed to the party's user when the party opens
it, and what the party makes in it is for that user alone (but its certificate
requests and public keys)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from party_harness import StoreParty, put_part
from ppfs_party.config import PartySettings
from ppfs_party.state import open_state


def _open_to_others(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (".", *dirnames, *filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                found.append(f"{stat.S_IMODE(st.st_mode):04o} {path.relative_to(root)}")
    return sorted(found)


@pytest.fixture
def open_umask() -> object:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_an_open_state_directory_is_narrowed_when_the_party_opens_it(
    tmp_path: Path, open_umask: None
) -> None:
    state = tmp_path / "party0"
    (state / "jobs").mkdir(parents=True, mode=0o755)
    for d in (state, state / "jobs"):
        d.chmod(0o755)
    open_state(PartySettings(state_dir=state, index=0, listen="127.0.0.1:0",
                             mpc_host="127.0.0.1", mpc_port_base=40000,
                             mpc_bind_host="127.0.0.1"))
    # csr/ holds certificate requests and public keys, for the operator to take away
    found = [f for f in _open_to_others(state) if not f.split()[1].startswith("csr")]
    assert found == []


def test_a_stored_upload_is_for_the_party_alone(tmp_path: Path, open_umask: None) -> None:
    # a part is kept opened (its share components in the clear) once it is accepted
    (tmp_path / "state").mkdir(mode=0o700)
    party = StoreParty.create(tmp_path / "state", seed=2)
    store = party.store()
    for upload_id, staged in (("u1", False), ("u2", True)):
        asyncio.run(put_part(store, party.sealed(upload_id), staged=staged))
    assert (tmp_path / "state" / "uploads" / "u1" / "data.shr").exists()
    assert party.staged_dir("u2").exists()
    assert _open_to_others(tmp_path / "state" / "uploads") == []
    assert _open_to_others(tmp_path / "state" / "staged") == []
