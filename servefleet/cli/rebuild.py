"""`servefleet rebuild INVENTORY DEPLOY --limit HOST [--data K=V] [--purge-models] [--yes] [--json]`.

Stops the services, removes venvs, builds, units, state and release records (the models are
kept unless --purge-models), then converges DEPLOY, through pyinfra's API. Acts only on the
hosts --limit selects (at most --max-hosts, 1 by default, so a group name cannot wipe a fleet
by accident), refuses when any of them cannot be reached, and asks first unless --yes.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict

from servefleet.cli.args import parse_data
from servefleet.core.errors import Exit
from servefleet.verbs import rebuild


def register(sub) -> None:
    p = sub.add_parser("rebuild", help="rebuild a node from scratch")
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--limit", action="append", required=True, help="host (repeatable)")
    p.add_argument("--max-hosts", type=int, default=1,
                   help="refuse when --limit selects more hosts than this (default 1)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="override data, as pyinfra's --data (for the converge and the teardown)")
    p.add_argument("--purge-models", action="store_true", help="also delete the models")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def _say(msg):
    print(f"servefleet rebuild: {msg}", file=sys.stderr)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    data = parse_data(args.data)
    planned = rebuild.plan(args.inventory, args.limit, args.max_hosts, data)
    if planned.exit_code != Exit.OK:
        _say(planned.message)
        return int(planned.exit_code)
    what = "services, venvs, builds, state" + (" AND MODELS" if args.purge_models else "")
    if not args.yes:
        answer = input(f"Rebuild {', '.join(planned.hosts)}: remove {what}, then converge "
                       f"{args.deploy}? [yes/no] ")
        if answer.strip().lower() != "yes":
            _say("cancelled; nothing was changed")
            return int(Exit.DIFFERS)
    result = rebuild.rebuild(args.inventory, args.deploy, planned.hosts, args.purge_models, data)
    if args.json:
        print(json.dumps({"hosts": result.hosts, "purge_models": args.purge_models,
                          "teardown": {n: asdict(o) for n, o in result.teardown.items()},
                          "converge": {n: asdict(o) for n, o in result.converge.items()},
                          "ok": result.exit_code == Exit.OK}, indent=2))
    else:
        for phase, outcomes in (("teardown", result.teardown), ("converge", result.converge)):
            for name, o in outcomes.items():
                print(f"{name}: {phase} {'ok' if o.ok else 'FAILED'} ({o.changed} of "
                      f"{o.operations} operations changed){'' if o.ok else ': ' + str(o.error)}")
    if result.message:
        _say(result.message)
    return int(result.exit_code)
