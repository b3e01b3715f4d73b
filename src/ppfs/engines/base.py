"""What every engine offers, and the per-party input layout both engines read.

Party i's inputs live in its own directory (``party_dirs[i]``) and an engine gives
party i's process that directory only:

- ``data.shr``   ShareBundle kind "data",   shape (m, p): encoded feature values
- ``labels.shr`` ShareBundle kind "labels", shape (m, n-1): one-hot labels (0/1)
- ``mask.shr``   ShareBundle kind "mask",   shape (k + m*k, 2): the recipient's mask words
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ppfs.step2a import Security, Step2AShape

PARTY_NAMES = ("Alice", "Bob", "Carol", "Dave")
INPUT_FILES = ("data.shr", "labels.shr", "mask.shr")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Step2AInputs:
    shape: Step2AShape
    security: Security
    party_dirs: tuple[Path, ...]


@dataclass
class PartyStats:
    party: str
    exit_code: int | None
    seconds: float
    bytes_sent: int


@dataclass
class EngineRun:
    """What an engine hands back: only masked words, plus run statistics."""

    engine: str
    opened: np.ndarray  # uint64, shape.outputs masked words
    seconds: float  # from launching the parties until the last one exited
    bytes_sent: int
    parties: list[PartyStats] = field(default_factory=list)
    program_hash: str | None = None
    compile_seconds: float = 0.0  # compiling (or finding the cached program), not in seconds


class Engine(Protocol):
    name: str

    def unavailable_reason(self) -> str | None:
        """None when usable here, else a one-line reason."""

    def supports(self, security: Security) -> bool: ...

    async def run_step2a(
        self, inputs: Step2AInputs, workdir: Path, progress: Progress | None = None
    ) -> EngineRun: ...
