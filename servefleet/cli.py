"""`servefleet` command line: one sub-command per module in servefleet/commands/."""

import argparse
import importlib
import pkgutil
import sys

from servefleet import commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servefleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Each module in servefleet/commands/ exposes register(subparsers) and sets func=run(args)->int.
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"servefleet.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
