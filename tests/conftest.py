"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from service_fakes import Stack, make_stack


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A gateway over fake parties (tests/service_fakes.py), for one test; a module may
    define its own ``stack`` where it needs another."""
    s = make_stack(tmp_path)
    yield s
    s.close()
