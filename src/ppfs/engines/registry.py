"""Finding an engine: MP-SPDZ when installed, else MPyC.

MP-SPDZ is looked for at ``$MPSPDZ_HOME`` (only there when set), else
``/opt/mp-spdz``, else the newest release installed by ``ppfs engine install
mp-spdz`` (``~/.cache/ppfs/mp-spdz/<version>``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ppfs.engines.base import Engine
from ppfs.engines.mpspdz_release import installed_homes
from ppfs.errors import EngineUnavailableError
from ppfs.jobflags import ENGINE_PREFERENCE

SYSTEM_MPSPDZ_HOME = Path("/opt/mp-spdz")
DEFAULT_MPSPDZ_HOME = SYSTEM_MPSPDZ_HOME  # older name
ENGINE_NAMES = ENGINE_PREFERENCE


def mpspdz_candidates() -> list[tuple[Path, str]]:
    """Where MP-SPDZ is looked for, in order, with how each place was chosen."""
    env = os.environ.get("MPSPDZ_HOME")
    if env:
        return [(Path(env), "MPSPDZ_HOME")]
    return [(SYSTEM_MPSPDZ_HOME, "the system location"),
            *((h, "installed by ppfs engine install") for h in installed_homes())]


def mpspdz_home() -> Path:
    """The first candidate holding compile.py, else the first candidate."""
    candidates = mpspdz_candidates()
    for home, _ in candidates:
        if (home / "compile.py").is_file():
            return home
    return candidates[0][0]


def get_engine(name: str) -> Engine:
    if name == "mp-spdz":
        from ppfs.engines.mpspdz import MpSpdzEngine

        return MpSpdzEngine(mpspdz_home())
    if name == "mpyc":
        from ppfs.engines.mpyc_engine import MpycEngine

        return MpycEngine()
    raise EngineUnavailableError(
        f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}"
    )


def remove_share_copies(party_dir: Path) -> None:
    """Delete what any engine's run may have left of a party's share data in
    ``party_dir``, that party's working directory for the run; its logs and status stay.
    (MPyC keeps none there: its worker reads the run's input directory.)"""
    from ppfs.engines.mpspdz import remove_share_copies as mpspdz_copies

    mpspdz_copies(party_dir)


def engine_unavailable_reason(name: str) -> str | None:
    try:
        return get_engine(name).unavailable_reason()
    except ImportError as exc:
        return f"not installed ({exc})"


def default_engine_name(security: str | None = None) -> str:
    """The best engine usable here that runs ``security``: mp-spdz when found, else mpyc."""
    from ppfs.step2a import Security

    for name in ENGINE_PREFERENCE:
        if engine_unavailable_reason(name) is not None:
            continue
        if security is None or get_engine(name).supports(Security(security)):
            return name
    return ENGINE_PREFERENCE[-1]
