"""Finding an engine: MP-SPDZ when installed (MPSPDZ_HOME, else /opt/mp-spdz), else MPyC."""

from __future__ import annotations

import os
from pathlib import Path

from ppfs.engines.base import Engine
from ppfs.errors import EngineUnavailableError

DEFAULT_MPSPDZ_HOME = Path("/opt/mp-spdz")
ENGINE_NAMES = ("mp-spdz", "mpyc")


def mpspdz_home() -> Path:
    env = os.environ.get("MPSPDZ_HOME")
    return Path(env) if env else DEFAULT_MPSPDZ_HOME


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


def default_engine_name() -> str:
    """mp-spdz when it is usable here, else mpyc."""
    try:
        if get_engine("mp-spdz").unavailable_reason() is None:
            return "mp-spdz"
    except ImportError:
        pass
    return "mpyc"
