"""Every package depends only downward: the core (ppfs) on nothing of the project above
it, each daemon (ppfs_party, ppfs_gateway) and the client (ppfs_client) on the core
only, and the ``ppfs`` command with the development stack (ppfs_cli) on anything.

Every import in every module counts, including those inside functions, and so does
importlib.import_module / __import__ with a literal name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "ppfs": ROOT / "src" / "ppfs",
    "ppfs_party": ROOT / "services" / "party" / "ppfs_party",
    "ppfs_gateway": ROOT / "services" / "dealer-gateway" / "ppfs_gateway",
    "ppfs_client": ROOT / "clients" / "ppfs_client",
    "ppfs_cli": ROOT / "tools" / "ppfs_cli",
}
ALLOWED = {
    "ppfs": {"ppfs"},
    "ppfs_party": {"ppfs", "ppfs_party"},
    "ppfs_gateway": {"ppfs", "ppfs_gateway"},
    "ppfs_client": {"ppfs", "ppfs_client"},
    "ppfs_cli": set(PACKAGES),
}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``tree``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            arg = node.args[0]
            if (name in ("import_module", "__import__") and isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)):
                found.append((node.lineno, arg.value.split(".")[0]))
    return found


def _modules(package: str) -> list[Path]:
    # (the MP-SPDZ programs are compiled by MP-SPDZ, not imported)
    return sorted(
        p for p in PACKAGES[package].rglob("*.py") if "mpspdz_programs" not in p.parts
    )


def test_every_package_is_found():
    for package, path in PACKAGES.items():
        assert (path / "__init__.py").is_file(), package
        assert len(_modules(package)) >= 2, package


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_imports_only_downward(package):
    broken = []
    for path in _modules(package):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in _imported(tree):
            if name in PACKAGES and name not in ALLOWED[package]:
                broken.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not broken, f"{package} may use only {sorted(ALLOWED[package])}:\n" + "\n".join(
        broken
    )


def test_the_rule_catches_a_violation():
    """The checker itself: an upward import, lazy or by name, is seen."""
    src = (
        "import ppfs.pki\n"
        "def f():\n"
        "    from ppfs_party.keys import PartyKeys\n"
        "    import importlib\n"
        "    importlib.import_module('ppfs_gateway.commands')\n"
    )
    names = [n for _, n in _imported(ast.parse(src))]
    assert sorted(names) == ["importlib", "ppfs", "ppfs_gateway", "ppfs_party"]
