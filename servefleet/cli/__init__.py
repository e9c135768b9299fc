"""`servefleet` command line: one sub-command per module of servefleet/cli/, the commands each
engine declares (Engine.commands: modules of its package, e.g. plan-kv), plus the commands
other installed packages register under the entry-point group `servefleet.commands` (the dev
package's demo, testbed and hub), so this package never imports them."""

from __future__ import annotations

import argparse
import functools
import importlib
import signal
import sys
import threading
from importlib.metadata import PackageNotFoundError, entry_points, version

from servefleet.cli import json_report, pipes, workdir
from servefleet.core.errors import EXIT_DOCS, DataError, Exit, InputError
from servefleet.engines import ENGINES

COMMANDS = (
    "bench",
    "drift",
    "help",
    "inspect",
    "knobs",
    "rebuild",
    "report",
    "rollback",
    "rollout",
    "status",
)
# The commands that act on a fleet and exit by the table below (inspect, knobs and plan-kv read
# local files and say their own exit status).
FLEET_VERBS = ("bench", "drift", "rebuild", "report", "rollback", "rollout", "status")


DESCRIPTION = """\
Provision, check and upgrade LLM serving nodes (on pyinfra).

Converging a node is pyinfra itself, run from the repository root (files/,
group_data/ and inventory/fleet.yml are found from there):
  pyinfra inventory/<role>.py deploys/<recipe>.py
These commands check, upgrade and inspect what pyinfra converged.
`servefleet help COMMAND` (or `servefleet COMMAND --help`): a command's help."""


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


class Refused(Exception):
    """Arguments argparse refuses (exit 2): the parser that refused them, and why."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    """argparse's parser (sub-commands' too), whose refusal main() reports: as argparse does,
    or as a JSON error object under --json."""

    def error(self, message: str):  # type: ignore[override]
        raise Refused(self, message)


def package_version() -> str:
    try:
        return version("servefleet")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


@functools.cache
def command_modules() -> dict[str, tuple[str, bool]]:
    """Each command's name -> (its module, which has register(subparsers); whether it is another
    package's, which may be unavailable): the operator commands, the engines' and the entry
    points' (the dev package's demo, testbed, hub). Nothing is imported here."""
    found = {name: (f"servefleet.cli.{name}", False) for name in COMMANDS}
    for engine in ENGINES:
        for module in engine.commands:  # cli.plan_kv registers plan-kv
            found[module.rsplit(".", 1)[-1].replace("_", "-")] = (
                f"{engine.package}.{module}",
                False,
            )
    for ep in sorted(entry_points(group="servefleet.commands"), key=lambda e: e.name):
        found[ep.name] = (ep.module, True)
    return found


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, with `only` (a command's name), of that one alone: a run
    imports the command it runs, not every other (the operator's CLI runs once per fleet
    action, and each command's imports cost a tenth of a second or more)."""
    parser = Parser(
        prog="servefleet",
        description=DESCRIPTION,
        epilog=exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"servefleet {package_version()}")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        title="operator commands (test tooling: demo, hub, testbed)",
    )
    # Each module exposes register(subparsers) and sets func=run(args) -> int.
    for name, (path, optional) in command_modules().items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(path)
        except ImportError as exc:  # an entry point's (the dev package's) needs not installed
            if not optional:
                raise
            sub.add_parser(name, help=f"(unavailable: {exc})")
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
    """The command's exit code; 141 when its output went into a pipe nobody reads any more
    (servefleet/cli/pipes.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with pipes.guarded() as streams:
        try:
            code = _main(argv)
        except SystemExit as done:  # --help, --version: printed, then argparse exits 0
            code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    return pipes.SIGPIPE_EXIT if pipes.broken(streams) else code


def _refuse(args, message: str, code: Exit) -> int:
    """A refusal: one line on stderr, and under --json the JSON error object on stdout."""
    print(f"servefleet {args.command}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        json_report.emit(json_report.refusal(message, code))
    return int(code)


def _main(argv: list[str]) -> int:
    # The command named first (no top-level option takes a value): only its module is imported.
    # Anything else (none, an option, a name no command has) gets every command's parser, for
    # the help or argparse's refusal that lists them.
    first = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(first if first in command_modules() else None)
    if not argv:  # what to type is the answer: the help, as a usage error (argparse's exit 2)
        parser.print_help(sys.stderr)
        return int(Exit.BAD_INPUT)
    try:
        args = parser.parse_args(argv)
    except Refused as refused:
        refused.parser.print_usage(sys.stderr)
        message = f"{refused.parser.prog}: error: {refused}"
        print(message, file=sys.stderr)
        if "--json" in argv:
            json_report.emit(json_report.refusal(message, Exit.BAD_INPUT))
        return int(Exit.BAD_INPUT)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        with workdir.in_project(args):
            return int(args.func(args) or 0)
    except (DataError, InputError) as exc:
        return _refuse(args, str(exc), Exit.BAD_INPUT)
    except KeyboardInterrupt:
        return _refuse(args, "interrupted; rerun the same command to finish", Exit.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
