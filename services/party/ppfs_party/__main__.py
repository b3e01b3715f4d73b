"""``python -m ppfs_party serve ...``: the party commands without the rest of the CLI."""

from __future__ import annotations

import argparse
import sys

from ppfs_party.commands import add_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ppfs_party")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    args = parser.parse_args(["party", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
