"""`servefleet rebuild INVENTORY DEPLOY --limit HOST [--data K=V] [--purge-models] [--yes] [--json]`.

Stops the services, removes venvs, builds, units, state and release records (the models are
kept unless --purge-models), then converges DEPLOY, through pyinfra's API. Acts only on the
hosts --limit selects (at most --max-hosts, 1 by default, so a group name cannot wipe a fleet
by accident), refuses when any of them cannot be reached, and asks first unless --yes.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict

from servefleet.cli import json_report, progress
from servefleet.cli.args import parse_data
from servefleet.core.errors import DataError, Exit
from servefleet.verbs import rebuild


def register(sub) -> None:
    p = sub.add_parser("rebuild", help="rebuild a node from scratch")
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--limit", action="append", required=True, help="host (repeatable)")
    p.add_argument(
        "--max-hosts",
        type=int,
        default=1,
        help="refuse when --limit selects more hosts than this (default 1)",
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override data, as pyinfra's --data (for the converge and the teardown)",
    )
    p.add_argument("--purge-models", action="store_true", help="also delete the models")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation (y or yes)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def _say(msg):
    print(f"servefleet rebuild: {msg}", file=sys.stderr)


def confirmed(answer: str) -> bool:
    """The usual yes: y or yes, in any case; anything else (no answer, end of input) is a no."""
    return answer.strip().lower() in ("y", "yes")


def _report(args, result: rebuild.RebuildResult, refused: bool) -> dict:
    """--json (servefleet/cli/json_report.py): one object whatever happened, a refusal (bad
    input, unreachable, cancelled) included, whose message is then its error. Each host: its
    teardown's and its converge's outcome (null: not run) and whether both went well."""
    hosts = {}
    for name in result.hosts:
        down, up = result.teardown.get(name), result.converge.get(name)
        hosts[name] = {
            "teardown": asdict(down) if down else None,
            "converge": asdict(up) if up else None,
            "ok": bool(down and down.ok and up and up.ok),
        }
    rebuilt = sum(1 for h in hosts.values() if h["ok"])
    return json_report.document(
        hosts,
        {"rebuilt": rebuilt, "not_rebuilt": len(hosts) - rebuilt},
        result.exit_code,
        error=(result.message or None) if refused else None,
        purge_models=args.purge_models,
        refused=refused,
        ok=result.exit_code == Exit.OK,
        message=result.message or None,
    )


def _refuse(args, result: rebuild.RebuildResult) -> int:
    """Nothing was changed: the reason on stderr (and the JSON object with --json)."""
    if args.json:
        json_report.emit(_report(args, result, refused=True))
    _say(result.message)
    return int(result.exit_code)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    try:
        data = parse_data(args.data)
        planned = rebuild.plan(args.inventory, args.limit, args.max_hosts, data, args.deploy)
    except DataError as exc:
        return _refuse(args, rebuild.RebuildResult([], Exit.BAD_INPUT, str(exc)))
    if planned.exit_code != Exit.OK:
        return _refuse(args, planned)
    what = "services, venvs, builds, state" + (" AND MODELS" if args.purge_models else "")
    if not args.yes:
        # The question goes to stderr, so stdout stays the report (--json); no answer (end of
        # input) is a no.
        print(
            f"Rebuild {', '.join(planned.hosts)}: remove {what}, then converge {args.deploy}? "
            f"[y/N] ",
            end="",
            file=sys.stderr,
            flush=True,
        )
        if not confirmed(sys.stdin.readline()):
            return _refuse(
                args,
                rebuild.RebuildResult(
                    planned.hosts, Exit.DIFFERS, "cancelled; nothing was changed"
                ),
            )
    # The phase and the operation running, with the time, while it runs (minutes).
    console = progress.stderr_console(quiet=args.json)
    with progress.status(console, f"rebuilding {', '.join(planned.hosts)}") as line:

        def say(msg: str) -> None:
            _say(msg)
            line.phase(msg.split(" (", 1)[0])

        result = rebuild.rebuild(
            args.inventory,
            args.deploy,
            planned.hosts,
            args.purge_models,
            data,
            say=say,
            on_operation=line.detail,
        )
    if args.json:
        json_report.emit(_report(args, result, refused=False))
    else:
        for phase, outcomes in (("teardown", result.teardown), ("converge", result.converge)):
            for name, o in outcomes.items():
                print(
                    f"{name}: {phase} {'ok' if o.ok else 'FAILED'} ({o.changed} of "
                    f"{o.operations} operations changed){'' if o.ok else ': ' + str(o.error)}"
                )
    if result.message:
        _say(result.message)
    return int(result.exit_code)
