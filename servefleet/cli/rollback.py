"""`servefleet rollback INVENTORY --limit HOST... [--json]`: serve each host's previous release
again (kept on the node: nothing is downloaded or built), then gate it. A converge afterwards
returns the host to the data's release. Exit 0 rolled back and healthy, 4 needs attention."""

from __future__ import annotations

import json
import logging

from servefleet.cli.args import parse_data
from servefleet.cli.rollout import render
from servefleet.core.errors import Exit
from servefleet.verbs.rollback import rollback
from servefleet.verbs.rollout import ROLLED_BACK


def register(sub) -> None:
    p = sub.add_parser("rollback", help="serve the previous release again, on purpose")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append", required=True, help="host (repeatable)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    report = rollback(args.inventory, args.limit, parse_data(args.data),
                      lambda line: None if args.json else print(f"  {line}"))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    if report.refused is None and report.hosts and all(h.result == ROLLED_BACK
                                                       for h in report.hosts.values()):
        return int(Exit.OK)
    return int(report.exit_code)
