"""`ppfs` starts with what the command needs: the command table is right, and a select
imports none of the service's client, daemons or development stack."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest
from ppfs_cli.main import COMMAND_MODULES, build_parser, main

# What `ppfs select` never needs: the gateway client and its key formats, the daemons,
# the development stack, the job contract, the release installer's network and archives.
NOT_FOR_SELECT = (
    "httpx", "nacl", "grpc", "fastapi", "uvicorn", "pydantic", "rich", "mpyc",
    "ppfs_client", "ppfs_party", "ppfs_gateway", "ppfs_cli.devstack",
    "ppfs.contract", "ppfs.keycert", "ppfs.upload", "urllib.request", "tarfile",
)


def _choices(p: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


@pytest.mark.parametrize("module", sorted(COMMAND_MODULES))
def test_command_table_lists_what_each_module_adds(module):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    importlib.import_module(module).add_commands(sub)
    assert tuple(sub.choices) == COMMAND_MODULES[module]


def test_full_parser_has_every_command_in_table_order():
    every = [c for cs in COMMAND_MODULES.values() for c in cs]
    assert _choices(build_parser()) == every
    for module, commands in COMMAND_MODULES.items():
        for command in commands:
            assert _choices(build_parser(command)) == list(commands), module


def test_help_and_unknown_commands_list_every_command(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(c in out for cs in COMMAND_MODULES.values() for c in cs)
    with pytest.raises(SystemExit) as info:
        main(["nosuch"])
    assert info.value.code == 2
    assert "pki" in capsys.readouterr().err  # "invalid choice", naming every command


def test_select_imports_only_what_it_needs(tmp_path):
    """A fresh interpreter runs `ppfs select` (to a refused input, then loads the engine a
    run would use): none of the modules above is imported."""
    code = (
        "import json, sys\n"
        "from ppfs_cli.main import main\n"
        f"rc = main(['select', {str(tmp_path / 'none.csv')!r}, '--label', 'y', '--k', '1'])\n"
        "import ppfs.engines.mpspdz, ppfs.pki\n"
        "print(json.dumps([rc, sorted(sys.modules)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    rc, modules = json.loads(proc.stdout)
    assert rc == 2 and "no such file" in proc.stderr
    loaded = [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_SELECT)]
    assert not loaded, f"`ppfs select` imported {loaded}"
