"""ppfs command line: the embedded default (all parties as local processes)."""

# The description above is what `ppfs --help` prints. This module is the `ppfs` entry
# point: the core's own commands (select, demo, engine), then the client's, the party
# daemon's, the gateway's and the development stack's, each module offering
# add_commands(subparsers) and setting `func` on its parsers: func(args) -> exit code.

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ppfs.errors import EngineUnavailableError, InputDataError, ParameterError

EXIT_USAGE = 2

# The modules that add the commands, in `ppfs --help` order, and the commands each adds
# (tests/test_cli_startup.py checks both). Running a command imports and builds only its
# own module's parsers: `ppfs select` starts without the client (httpx, PyNaCl), the
# daemons (gRPC) and the development stack, as pip's command table does. `ppfs --help`,
# no command or an unknown one builds them all.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "ppfs.cli": ("select", "demo", "engine"),
    "ppfs_client.commands": (
        "upload", "datasets", "masks", "jobs", "result", "keys", "deployment",
    ),
    "ppfs_party.commands": ("party", "pki"),
    "ppfs_gateway.commands": ("gateway",),
    "ppfs_cli.devstack": ("up", "demo-service"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``ppfs`` parser: every command, or with ``command`` that of its module only."""
    p = argparse.ArgumentParser(prog="ppfs", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for module, commands in COMMAND_MODULES.items():
        if command is None or command in commands:
            importlib.import_module(module).add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known = any(argv[:1] == [c] for cs in COMMAND_MODULES.values() for c in cs)
    args = build_parser(argv[0] if known else None).parse_args(argv)
    try:
        return int(args.func(args))
    except (InputDataError, ParameterError, EngineUnavailableError) as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
