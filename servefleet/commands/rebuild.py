"""`servefleet rebuild INVENTORY DEPLOY --limit HOST`: wipe what servefleet installed, converge.

Stops the services, removes venvs, builds, units and state (the model store is kept unless
--purge-models), then converges DEPLOY. Acts only on the hosts --limit selects (at most
--max-hosts, 1 by default, so a group name cannot wipe a fleet by accident), refuses when any
of them cannot be reached, and asks for confirmation unless --yes.
"""

import json
import logging
import sys

from servefleet import fleetapi
from servefleet.converge import pyinfra


def register(sub) -> None:
    p = sub.add_parser("rebuild", help="rebuild a node from scratch")
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--limit", action="append", required=True, help="host (repeatable)")
    p.add_argument("--max-hosts", type=int, default=1,
                   help="refuse when --limit selects more hosts than this (default 1)")
    p.add_argument("--purge-models", action="store_true", help="also delete the model store")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary instead of pyinfra's output")
    p.set_defaults(func=run)


def _say(msg):
    print(f"servefleet rebuild: {msg}", file=sys.stderr)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    with fleetapi.session(args.inventory, args.limit, check_for_changes=False) as sess:
        names = sorted(h.name for h in sess.targets)
        unreachable = dict(sess.unreachable)
    if not names:
        _say(f"--limit {' '.join(args.limit)} selects no host of {args.inventory}")
        return 2
    if len(names) > args.max_hosts:
        _say(f"--limit selects {len(names)} hosts ({', '.join(names)}), more than "
             f"--max-hosts {args.max_hosts}; name the hosts or raise --max-hosts")
        return 2
    if unreachable:
        _say("cannot reach " + ", ".join(f"{n} ({why})" for n, why in unreachable.items())
             + "; nothing was changed")
        return 2
    what = "services, venvs, builds, state" + (" AND MODELS" if args.purge_models else "")
    if not args.yes:
        answer = input(f"Rebuild {', '.join(names)}: remove {what}, then converge "
                       f"{args.deploy}? [yes/no] ")
        if answer.strip().lower() != "yes":
            _say("cancelled; nothing was changed")
            return 1
    limit = ",".join(names)
    wipe = pyinfra(args.inventory, "deploys/teardown.py", limit=limit,
                   data={"purge_models": str(args.purge_models).lower()})
    converge = pyinfra(args.inventory, args.deploy, limit=limit) if wipe.returncode == 0 else None
    ok = converge is not None and converge.returncode == 0
    if args.json:
        print(json.dumps({"hosts": names, "purge_models": args.purge_models,
                          "teardown": {"ok": wipe.returncode == 0, "changed": wipe.changed},
                          "converge": None if converge is None else
                          {"ok": converge.returncode == 0, "changed": converge.changed,
                           "errors": converge.errors}, "ok": ok}, indent=2))
    else:
        print(wipe.output)
        if converge is None:
            _say("teardown failed; not converging")
        else:
            print(converge.output)
    return 0 if ok else 1
