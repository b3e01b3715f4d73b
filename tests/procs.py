"""Finding the processes a test started, by where they run (engine parties work in
per-party directories below the test's temporary directory)."""

from __future__ import annotations

from pathlib import Path


def processes_in(root: Path) -> list[int]:
    """PIDs of processes whose working directory is ``root`` or lies below it."""
    root = root.resolve()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = (entry / "cwd").resolve()
        except OSError:
            continue
        if cwd == root or root in cwd.parents:
            found.append(int(entry.name))
    return found
