"""`servefleet` command line: one sub-command per module of servefleet/cli/, plus the commands
other installed packages register under the entry-point group `servefleet.commands` (the dev
package's demo, testbed and hub), so this package never imports them."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from importlib.metadata import entry_points

from servefleet.core.errors import DataError, Exit, InputError

COMMANDS = ("bench", "drift", "inspect", "knobs", "plan_kv", "rebuild", "rollback", "rollout",
            "status")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servefleet", description="Provision, check and upgrade LLM serving nodes (pyinfra).")
    sub = parser.add_subparsers(dest="command", required=True)
    # Each module exposes register(subparsers) and sets func=run(args) -> int.
    for name in COMMANDS:
        importlib.import_module(f"servefleet.cli.{name}").register(sub)
    for ep in sorted(entry_points(group="servefleet.commands"), key=lambda e: e.name):
        try:
            module = ep.load()
        except ImportError as exc:  # the dev package's needs are not installed
            sub.add_parser(ep.name, help=f"(unavailable: {exc})")
            continue
        module.register(sub)
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
        print(f"servefleet {args.command}: interrupted; rerun the same command to finish",
              file=sys.stderr)
        return int(Exit.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
