"""`servefleet help [COMMAND [ACTION]]`: a command's help, as `servefleet COMMAND --help` prints it
(`servefleet help testbed up` for a testbed action); `servefleet help` alone: the commands."""

from __future__ import annotations

import argparse
import difflib

from servefleet.cli import build_parser
from servefleet.core.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("help", help="a command's help: servefleet help COMMAND")
    p.add_argument("topic", nargs="*", metavar="COMMAND")
    p.set_defaults(func=run)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def run(args) -> int:
    parser: argparse.ArgumentParser = build_parser()
    for word in args.topic:
        commands = _commands(parser)
        if word not in commands:
            close = difflib.get_close_matches(word, list(commands), n=1)
            hint = (
                f"did you mean {close[0]}?" if close else f"expected one of {', '.join(commands)}"
            )
            raise InputError(
                f"{parser.prog} has no command {word!r}" + (f"; {hint}" if commands else "")
            )
        parser = commands[word]
    print(parser.format_help(), end="")
    return 0
