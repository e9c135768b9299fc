"""`servefleet drift INVENTORY DEPLOY [--limit ...] [--json] [--wide] [--all] [--debug]`: is
every host as the data says? Exit 0 in sync, 1 drift, 3 a host could not be checked (3 wins)."""

from __future__ import annotations

import logging

from servefleet.cli import json_report
from servefleet.cli.args import parse_data
from servefleet.cli.output import cut, table, width, wrap
from servefleet.verbs import drift


def register(sub) -> None:
    p = sub.add_parser("drift", help="check hosts against a deploy without changing anything")
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--limit", action="append", help="host name, glob or group (repeatable)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override data, as pyinfra's --data",
    )
    p.add_argument("--json", action="store_true", help="machine-readable report (see docs/day2.md)")
    p.add_argument("--wide", action="store_true", help="expected and found in full")
    p.add_argument("--all", action="store_true", help="list in-sync items too")
    p.add_argument(
        "--debug",
        action="store_true",
        help="pyinfra's debug log on stderr (each command run on a host)",
    )
    p.set_defaults(func=run)


def render(report: drift.Report, show_all: bool = False, wide: bool = False) -> str:
    """One line per host in sync; a line per differing item (cut to the terminal) otherwise.
    Why a host was not checked is never cut: it is wrapped to the terminal's width."""
    cols = width()

    def fit(line: str) -> str:
        return line if wide else cut(line, cols)

    out = []
    for host in report.hosts.values():
        counts = {
            s: sum(i.state == s for i in host.items)
            for s in ("in_sync", "drifted", "conditional", "always_runs")
        }
        caption = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        out.append(fit(f"{host.name}: {host.status}" + (f" ({caption})" if caption else "")))
        if host.error:
            out += wrap(f"unchecked: {host.error}", cols, "  ", "    ")
        # An operation's last name part says what it is ("Unit servefleet-llama.service");
        # --wide and --json keep the whole "deploy | step | operation" name.
        rows = [
            (i.state, i.name if wide else i.name.rsplit(" | ", 1)[-1], i.expected, i.found)
            for i in host.items
            if show_all or i.state == "drifted"
        ]
        if not rows:
            continue
        if wide:
            for state, name, expected, found in rows:
                out.append(f"  {state}: {name}")
                out.append(f"    expected: {expected}")
                out += [
                    f"    found:    {line}" if n == 0 else f"              {line}"
                    for n, line in enumerate(str(found).splitlines() or [""])
                ]
        else:
            flat = [(s, n, e, str(f).replace("\n", " | ")) for s, n, e, f in rows]
            # The check's name is what the operator acts on: never cut (expected and found
            # are, first; --wide shows them whole).
            body = table(
                ("state", "check", "expected", "found"),
                flat,
                cols - 2,
                shrink=("expected", "found"),
            )
            out += [fit("  " + line) for line in body.splitlines()]
    summary = report.to_dict()["summary"]
    out.append(
        fit(
            f"drift: {summary['hosts']} hosts: {summary['in_sync']} in sync, "
            f"{summary['drifted']} drifted, {summary['unchecked']} unchecked "
            f"(exit {int(report.exit_code)})"
        )
    )
    return "\n".join(out)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)  # our report is the output
    report = drift.check(
        args.inventory, args.deploy, limit=args.limit, data=parse_data(args.data), debug=args.debug
    )
    if args.json:
        doc = report.to_dict()
        json_report.emit(
            json_report.document(
                doc["hosts"],
                doc["summary"],
                doc["exit_code"],
                inventory=doc["inventory"],
                deploy=doc["deploy"],
            )
        )
    else:
        print(render(report, show_all=args.all, wide=args.wide))
    return int(report.exit_code)
