"""`servefleet hub serve|publish|stats|fault`: the local Hugging Face hub (see servefleet_dev.hub)."""

import argparse
import json
import os
import sys
import urllib.error

from servefleet.core.paths import cache_subdir

# servefleet_dev.hub imports this module back (its main() runs these commands): read the
# package's attributes inside functions only, never at import time.
from servefleet_dev import hub


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "hub",
        help="serve model repos over the Hugging Face hub's file API (tests, testbed, benchmarks)",
        description=__doc__,
    )
    add_subcommands(parser)
    parser.set_defaults(func=run)


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    """The sub-commands, shared with `python -m servefleet_dev.hub`."""
    sub = parser.add_subparsers(dest="hub_command", required=True)
    root_help = "store directory (default: $SERVEFLEET_CACHE/hub, i.e. ~/.cache/servefleet/hub)"

    p = sub.add_parser("serve", help="serve the store until SIGTERM")
    p.add_argument("--root", help=root_help)
    p.add_argument(
        "--host",
        action="append",
        help="address to bind (loopback or the testbed bridge; repeat for several; default 127.0.0.1)",
    )
    p.add_argument("--port", type=int, default=0, help="port (default: 0, a free one, printed)")
    token = p.add_mutually_exclusive_group()
    token.add_argument(
        "--token", help="require 'Authorization: Bearer TOKEN' (visible in ps: prefer --token-file)"
    )
    token.add_argument("--token-file", help="read the required token from this file")
    p.add_argument("--pidfile", help="write the server's pid here once listening")
    p.add_argument("--ready-file", help="write the URL(s) here once listening (removed on exit)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")

    p = sub.add_parser("publish", help="commit a local directory to a repo; prints the commit sha")
    p.add_argument("repo_id", help="ORG/NAME")
    p.add_argument("src_dir", help="directory whose files become the commit")
    p.add_argument("--root", help=root_help)
    p.add_argument("--branch", default="main")
    p.add_argument("--message", "-m")
    p.add_argument("--repo-type", choices=hub.REPO_TYPES, default="model")
    p.add_argument(
        "--link", action="store_true", help="hard-link files into the store instead of copying"
    )

    p = sub.add_parser("stats", help="bytes a running hub has served")
    p.add_argument("--url", required=True, help="base URL of the hub, e.g. http://127.0.0.1:8900")
    p.add_argument("--reset", action="store_true", help="zero the counters (prints them as reset)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")

    p = sub.add_parser("fault", help="throttle or cut downloads of a running hub (tests)")
    p.add_argument("--url", required=True)
    p.add_argument(
        "pattern", nargs="?", default="*", help="fnmatch over ORG/NAME/PATH (default: *)"
    )
    p.add_argument("--rate", type=int, help="bytes per second")
    p.add_argument("--drop-after", type=int, help="close the connection after N body bytes")
    p.add_argument("--times", type=int, help="affect only the next N downloads")
    p.add_argument("--clear", action="store_true", help="remove all rules")


def _root(args) -> str:
    if args.root:
        return args.root
    return str(cache_subdir("hub"))


def run(args) -> int:
    try:
        return _COMMANDS[args.hub_command](args)
    except urllib.error.URLError as exc:
        print(f"servefleet hub: cannot reach {args.url}: {exc.reason}", file=sys.stderr)
        return 1


def _serve(args) -> int:
    token = args.token
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    return hub.serve(
        _root(args),
        args.host or ["127.0.0.1"],
        args.port,
        token=token,
        pidfile=args.pidfile,
        ready_file=args.ready_file,
        verbose=args.verbose,
    )


def _publish(args) -> int:
    if not os.path.isdir(args.src_dir):
        print(f"servefleet hub: not a directory: {args.src_dir}", file=sys.stderr)
        return 1
    sha = hub.publish(
        _root(args),
        args.repo_id,
        args.src_dir,
        branch=args.branch,
        message=args.message,
        repo_type=args.repo_type,
        link=args.link,
    )
    print(sha)
    return 0


def _stats(args) -> int:
    stats = hub.hub_stats(args.url, reset=args.reset)
    if args.json:
        print(json.dumps(stats, indent=1))
        return 0
    print(f"total body bytes: {stats['total_bytes']}  (api: {stats['api_bytes']})")
    print("requests: " + ", ".join(f"{k}={v}" for k, v in stats["requests"].items()))
    for key, f in sorted(stats["files"].items()):
        print(f"  {f['bytes']:>14}  {f['gets']:>4} GET ({f['range_gets']} ranged)  {key}")
    return 0


def _fault(args) -> int:
    if args.clear:
        hub.clear_faults(args.url)
        print("no fault rules")
        return 0
    rules = hub.set_fault(
        args.url,
        args.pattern,
        bytes_per_second=args.rate,
        drop_after=args.drop_after,
        times=args.times,
    )
    print(json.dumps(rules, indent=1))
    return 0


_COMMANDS = {"serve": _serve, "publish": _publish, "stats": _stats, "fault": _fault}


DESCRIPTION = "A local server speaking the Hugging Face hub's file API, for tests, the testbed and benchmarks."


def main(argv: list[str] | None = None) -> int:
    """`python -m servefleet_dev.hub serve|publish|stats|fault ...` (same as `servefleet hub ...`)."""
    parser = argparse.ArgumentParser(prog="python -m servefleet_dev.hub", description=DESCRIPTION)
    add_subcommands(parser)
    return run(parser.parse_args(argv))
