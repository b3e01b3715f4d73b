"""ppfs.engines.mpspdz_check: active 3PC is refused on an MP-SPDZ build whose SPDZ-wise
check accepts a forged MAC. A stand-in party binary plays such a build (and one whose
probe ends neither way); the real build's verdict is in tests/test_engine_mpspdz.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.mpspdz_check import check_spdzwise
from ppfs.errors import EngineError
from ppfs.step2a import Security, Step2AShape


def _fake_home(root: Path, party_script: str) -> Path:
    """An MP-SPDZ home whose compiler succeeds without output and whose active-3PC
    party binary is ``party_script`` (a shell script)."""
    home = root / "mp-spdz"
    (home / "Compiler").mkdir(parents=True)
    (home / "compile.py").write_text("import sys\nsys.exit(0)\n")
    binary = home / "sy-rep-ring-party.x"
    binary.write_text("#!/bin/sh\n" + party_script)
    binary.chmod(0o755)
    return home


# what a build with a void check does with the probe: every party finishes, party 0
# prints the opened square
VOID_BUILD = 'case " $* " in *" -p 0 "*) echo "PPFS-FORGED-MAC-ACCEPTED 9";; esac\nexit 0\n'


def test_a_build_that_accepts_a_forged_mac_is_refused(tmp_path: Path) -> None:
    home = _fake_home(tmp_path, VOID_BUILD)
    cache = tmp_path / "cache"
    with pytest.raises(EngineError, match="accepts a value whose MAC was forged") as info:
        asyncio.run(check_spdzwise(home, home / "sy-rep-ring-party.x", cache))
    assert "refuses to run active-3pc" in str(info.value)
    (verdict,) = (cache / "checks").iterdir()
    assert verdict.read_text().strip() == "void"
    # the verdict is kept per binary: a second call does not run the probe again
    (home / "compile.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(EngineError, match="accepts a value whose MAC was forged"):
        asyncio.run(check_spdzwise(home, home / "sy-rep-ring-party.x", cache))


def test_the_engine_refuses_active_3pc_on_such_a_build(tmp_path: Path) -> None:
    home = _fake_home(tmp_path, VOID_BUILD)
    engine = MpSpdzEngine(home, cache_dir=tmp_path / "cache")
    assert engine.supports(Security.ACTIVE_3PC)
    with pytest.raises(EngineError, match="refuses to run active-3pc"):
        asyncio.run(engine.prepare(Step2AShape(20, 5, 2, 2), Security.ACTIVE_3PC))


def test_a_probe_that_ends_neither_way_is_not_taken_for_a_verdict(tmp_path: Path) -> None:
    # the parties fail for another reason (no MAC check failed): no verdict is kept
    home = _fake_home(tmp_path, 'echo "Fatal error: something else" >&2\nexit 1\n')
    cache = tmp_path / "cache"
    with pytest.raises(EngineError, match="ended neither way"):
        asyncio.run(check_spdzwise(home, home / "sy-rep-ring-party.x", cache))
    assert not (cache / "checks").exists()


def test_a_build_whose_check_works_is_accepted(tmp_path: Path) -> None:
    # what a sound build does: the opening's check fails and every party stops
    home = _fake_home(tmp_path, 'echo "Fatal error at mac_probe-0:4 (OPEN): check hash '
                                'mismatch" >&2\nexit 1\n')
    cache = tmp_path / "cache"
    asyncio.run(check_spdzwise(home, home / "sy-rep-ring-party.x", cache))
    (verdict,) = (cache / "checks").iterdir()
    assert verdict.read_text().strip() == "sound"


def test_the_parties_find_mp_spdz_libraries_in_its_home(tmp_path: Path) -> None:
    # a release or a copied build finds libSPDZ.so only through LD_LIBRARY_PATH (the
    # party image's): a party that cannot start exits 127, as the loader makes it
    home = _fake_home(tmp_path, 'case ":$LD_LIBRARY_PATH:" in *":$(dirname "$0"):"*) ;; '
                                '*) exit 127;; esac\n'
                                'echo "Fatal error: check hash mismatch" >&2\nexit 1\n')
    asyncio.run(check_spdzwise(home, home / "sy-rep-ring-party.x", tmp_path / "cache"))


def test_parties_that_check_at_once_run_one_probe(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # three parties of one machine sharing a cache check the build at once (as their
    # first active-3PC jobs start together): one probe runs, the others take its verdict
    # (three probes at once ran nine MP-SPDZ parties on free ports side by side)
    import ppfs.engines.mpspdz_check as check

    home = _fake_home(tmp_path, "exit 0\n")
    cache = tmp_path / "cache"
    probes: list[int] = []

    async def probe(home: Path, binary: Path, cache_dir: Path) -> str:
        probes.append(1)
        await asyncio.sleep(0.3)  # while the others ask
        return check.SOUND

    monkeypatch.setattr(check, "_probe", probe)

    async def three() -> None:
        await asyncio.gather(*(check_spdzwise(home, home / "sy-rep-ring-party.x", cache)
                               for _ in range(3)))

    asyncio.run(three())
    assert len(probes) == 1
    (verdict,) = (cache / "checks").iterdir()
    assert verdict.read_text().strip() == "sound"
