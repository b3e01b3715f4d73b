"""Every party of a run started as its daemon starts it (``Engine.run_party``), each in
its own directory, optionally with its own session tag and progress callback."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ppfs.engines.base import PartyRunResult, PartyRunSpec, Progress, Step2AInputs


def party_specs(engine: Any, inputs: Step2AInputs, root: Path,
                tags: Sequence[int] | None = None) -> list[PartyRunSpec]:
    """The engine's specs for every party under ``root``/P<i>, with ``tags`` as the
    parties' session tags when given."""
    dirs = [root / f"P{i}" for i in range(inputs.security.parties)]
    specs: list[PartyRunSpec] = engine._embedded_specs(inputs, dirs)
    if tags is not None:
        specs = [dataclasses.replace(s, session_tag=t)
                 for s, t in zip(specs, tags, strict=True)]
    return specs


def run_every_party(
    engine: Any, specs: Sequence[PartyRunSpec],
    progress: Callable[[int], Progress | None] = lambda i: None,
) -> list[PartyRunResult | BaseException]:
    """Run all parties at once; each one's result or the exception it raised."""

    async def main() -> list[PartyRunResult | BaseException]:
        return await asyncio.gather(
            *(engine.run_party(s, progress(i)) for i, s in enumerate(specs)),
            return_exceptions=True)

    return asyncio.run(main())
