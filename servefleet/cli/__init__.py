"""`servefleet` command line: one sub-command per module of servefleet/cli/, the commands each
engine declares (Engine.commands: modules of its package, e.g. plan-kv), plus the commands
other installed packages register under the entry-point group `servefleet.commands` (the dev
package's demo, testbed and hub), so this package never imports them."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from importlib.metadata import entry_points

from servefleet.core.errors import EXIT_DOCS, DataError, Exit, InputError
from servefleet.engines import ENGINES

COMMANDS = (
    "bench",
    "drift",
    "inspect",
    "knobs",
    "rebuild",
    "rollback",
    "rollout",
    "status",
)
# The commands that act on a fleet and exit by the table below (inspect, knobs and plan-kv read
# local files and say their own exit status).
FLEET_VERBS = ("bench", "drift", "rebuild", "rollback", "rollout", "status")


DESCRIPTION = """\
Provision, check and upgrade LLM serving nodes (on pyinfra).

Converging a node is pyinfra itself, run from the repository root (files/,
group_data/ and inventory/fleet.yml are found from there):
  pyinfra inventory/<role>.py deploys/<recipe>.py
These commands check, upgrade and inspect what pyinfra converged."""


def exit_codes() -> str:
    """The exit codes, as the top-level help and every fleet verb's help end."""
    lines = ["exit codes:"]
    for code, text in EXIT_DOCS.items():
        words, line = text.split(), f"  {int(code):<4}"
        for word in words:
            if len(line) + 1 + len(word) > 78:
                lines.append(line)
                line = " " * 6
            line += ("" if line.endswith(" ") else " ") + word
        lines.append(line)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servefleet",
        description=DESCRIPTION,
        epilog=exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        title="operator commands (test tooling: demo, hub, testbed)",
    )
    # Each module exposes register(subparsers) and sets func=run(args) -> int.
    for name in COMMANDS:
        importlib.import_module(f"servefleet.cli.{name}").register(sub)
    for engine in ENGINES:
        for name in engine.commands:
            importlib.import_module(f"{engine.package}.{name}").register(sub)
    for ep in sorted(entry_points(group="servefleet.commands"), key=lambda e: e.name):
        try:
            module = ep.load()
        except ImportError as exc:  # the dev package's needs are not installed
            sub.add_parser(ep.name, help=f"(unavailable: {exc})")
            continue
        module.register(sub)
    # Every command's own help says what it does (its one-line help) and how it exits.
    helps = {action.dest: action.help for action in sub._choices_actions}
    for name, command in sub.choices.items():
        if command.description is None:
            command.description = helps.get(name)
        if name in FLEET_VERBS and command.epilog is None:
            command.epilog = exit_codes()
            command.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (a CI job cancelled, kill): the same clean stop as Ctrl-C


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.func(args) or 0)
    except (DataError, InputError) as exc:
        print(f"servefleet {args.command}: {exc}", file=sys.stderr)
        return int(Exit.BAD_INPUT)
    except KeyboardInterrupt:
        print(
            f"servefleet {args.command}: interrupted; rerun the same command to finish",
            file=sys.stderr,
        )
        return int(Exit.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
