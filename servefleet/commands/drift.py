"""`servefleet drift INVENTORY DEPLOY [--limit ...] [--json]`: exit 0 in sync, 1 drift, 2 unchecked."""

import json
import logging

from rich.console import Console
from rich.table import Table

from servefleet import drift


def register(sub) -> None:
    p = sub.add_parser("drift", help="check hosts against a deploy without changing anything")
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--limit", action="append", help="host name, glob or group (repeatable)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="override data, as pyinfra's --data")
    p.add_argument("--json", action="store_true", help="machine-readable report (see README)")
    p.add_argument("--all", action="store_true", help="list in-sync items too")
    p.set_defaults(func=run)


STYLE = {"in_sync": "green", "drifted": "red", "conditional": "yellow",
         "always_runs": "magenta", "unchecked": "red"}


def print_report(report: drift.Report, console: Console, show_all: bool = False) -> None:
    for host in report.hosts.values():
        counts = {s: sum(i.state == s for i in host.items) for s in STYLE if s != "unchecked"}
        caption = ", ".join(f"{n} {s}" for s, n in counts.items())
        if host.status == "in_sync" and not show_all:
            console.print(f"{host.name}: [green]in_sync[/] ({caption})")
            continue
        table = Table(title=f"{host.name}: [{STYLE[host.status]}]{host.status}[/]",
                      title_justify="left")
        for col in ("check", "state", "expected", "found"):
            table.add_column(col, overflow="fold")
        if host.error:
            table.add_row("host", "[red]unchecked[/]", "reachable, facts readable", host.error)
        for item in host.items:
            if item.state == "in_sync" and not show_all:
                continue
            table.add_row(item.name, f"[{STYLE[item.state]}]{item.state}[/]", item.expected,
                          item.found)
        table.caption = caption
        console.print(table)
    summary = report.to_dict()["summary"]
    console.print(f"drift: {summary['hosts']} hosts: {summary['in_sync']} in sync, "
                  f"{summary['drifted']} drifted, {summary['unchecked']} unchecked "
                  f"(exit {report.exit_code})")


def run(args) -> int:
    from pyinfra_cli.util import parse_cli_arg

    data = {}
    for pair in args.data:
        key, _, value = pair.partition("=")
        data[key] = parse_cli_arg(value)  # as pyinfra's --data: JSON, ints and booleans parsed
    logging.getLogger("pyinfra").setLevel(logging.ERROR)  # our table is the output
    report = drift.check(args.inventory, args.deploy, limit=args.limit, data=data)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report, Console(), show_all=args.all)
    return report.exit_code
