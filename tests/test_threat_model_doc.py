"""docs/threat-model.md points at its tests: every one it names must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "threat-model.md"


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def test_every_test_the_threat_model_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    named: list[tuple[str, str]] = []
    # `test_x.py::test_y`, a following `::test_z` in the same cell refers to the same file
    for cell in re.findall(r"`[^`]*`(?:[^|`\n]*`[^`]*`)*", text):
        current = ""
        for ref in re.findall(r"`([^`]+)`", cell):
            m = re.fullmatch(r"(?:tests/)?(test_\w+\.py)(?:::(test_\w+)(?:\[[^\]]*\])?)?", ref)
            if m:
                current = m.group(1)
                if m.group(2):
                    named.append((current, m.group(2)))
                elif not (ROOT / "tests" / current).is_file():
                    named.append((current, ""))
                continue
            m = re.fullmatch(r"::(test_\w+)(?:\[[^\]]*\])?", ref)
            if m and current:
                named.append((current, m.group(1)))
    assert len(named) > 40, "the threat model should point at its tests"
    missing = []
    for file, test in named:
        path = ROOT / "tests" / file
        if not path.is_file() or (test and test not in _tests_in(path)):
            missing.append(f"{file}::{test}" if test else file)
    assert not missing, f"docs/threat-model.md names tests that do not exist: {missing}"
