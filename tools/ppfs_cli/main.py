"""ppfs command line: the embedded default (all parties as local processes)."""

# The description above is what `ppfs --help` prints. This module is the `ppfs` entry
# point: the core's own commands (select, demo, engine), then the client's, the party
# daemon's, the gateway's and the development stack's, each module offering
# add_commands(subparsers) and setting `func` on its parsers: func(args) -> exit code.

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import ppfs_client.commands
import ppfs_gateway.commands
import ppfs_party.commands

import ppfs.cli
from ppfs.errors import EngineUnavailableError, InputDataError, ParameterError
from ppfs_cli import devstack

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppfs", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    ppfs.cli.add_commands(sub)
    ppfs_client.commands.add_commands(sub)
    ppfs_party.commands.add_commands(sub)
    ppfs_gateway.commands.add_commands(sub)
    devstack.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (InputDataError, ParameterError, EngineUnavailableError) as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
