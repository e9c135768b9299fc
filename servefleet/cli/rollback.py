"""`servefleet rollback INVENTORY --limit HOST... [--all] [--json]`: serve each host's previous release
again (kept on the node: nothing is downloaded or built), then gate it. A converge afterwards
returns the host to the data's release. Exit 0 rolled back and healthy, 4 needs attention."""

from __future__ import annotations

import logging

from servefleet.cli import json_report
from servefleet.cli.args import parse_data
from servefleet.cli.rollout import render, to_json
from servefleet.verbs.rollback import rollback


def register(sub) -> None:
    p = sub.add_parser("rollback", help="serve the previous release again, on purpose")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append", required=True, help="host (repeatable)")
    p.add_argument(
        "--all",
        action="store_true",
        dest="everything",
        help="allow a glob or group that selects more hosts than named one by one",
    )
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--wide", action="store_true", help="every column whole, whatever the width")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    report = rollback(
        args.inventory,
        args.limit,
        parse_data(args.data),
        lambda line: None if args.json else print(f"  {line}"),
        args.everything,
    )
    if args.json:
        json_report.emit(to_json(report))
    else:
        print(render(report, wide=args.wide))
    return int(report.exit_code)  # the code the report prints: 0 when all are rolled back
