"""Another user of a party's machine reads nothing of a run: every directory and file
an engine makes for a party (its share components, MAC keys, TLS key, opened words and
logs) is for the user that runs it alone, whatever the umask and however open the
folder it is given is (a state directory restored from a backup by a plain copy, a
--workdir made by hand)."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import ppfs.engines.mpspdz as mpspdz
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.local import prepare_inputs
from ppfs.step2a import Security
from ppfs.synthetic import make_table

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(
    _reason is not None, reason=f"MP-SPDZ not available: {_reason}"
)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common default: new files readable by everyone."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _open_to_others(root: Path) -> list[str]:
    """Every directory or regular file under ``root`` that grants its group or others
    any access (symbolic links carry no access of their own)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_mode & 0o077:
                found.append(f"{stat.S_IMODE(st.st_mode):04o} {path.relative_to(root)}")
    return sorted(found)


def _open_folder(path: Path) -> Path:
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    return path


@needs_mpspdz
@pytest.mark.mpspdz
def test_mpspdz_party_files_are_private_while_it_runs_and_after(
    tmp_path: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # active 3PC: the memory file of shares, the input file and MP-SPDZ's own MAC keys
    security = Security.ACTIVE_3PC
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=tmp_path / "cache", timeout=300)
    prep = prepare_inputs(make_table(30, 4, seed=3), 2, security, tmp_path / "owner")
    work = _open_folder(tmp_path / "work")
    seen: list[str] = []
    real = mpspdz.remove_share_copies

    def look_then_remove(party_dir: Path) -> None:
        # called once the parties have ended, before their share copies go
        assert any(party_dir.glob("Player-Data/*/Player-MAC-Keys-*"))
        seen.extend(_open_to_others(party_dir))
        real(party_dir)

    monkeypatch.setattr(mpspdz, "remove_share_copies", look_then_remove)
    asyncio.run(engine.run_step2a(prep.inputs, work))
    assert seen == [], seen
    assert _open_to_others(work / "mpspdz") == []


def test_mpyc_party_files_are_private(tmp_path: Path, open_umask: None) -> None:
    security = Security.PASSIVE_3PC
    engine = MpycEngine()
    prep = prepare_inputs(make_table(8, 3, seed=3), 1, security, tmp_path / "owner")
    work = _open_folder(tmp_path / "work")
    asyncio.run(engine.run_step2a(prep.inputs, work))
    assert sorted(p.name for p in (work / "mpyc").iterdir()) == ["P0", "P1", "P2"]
    assert _open_to_others(work / "mpyc") == [], _open_to_others(work / "mpyc")
