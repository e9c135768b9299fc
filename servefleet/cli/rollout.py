"""`servefleet rollout INVENTORY DEPLOY [--batch N|P%] [--max-failures K] [--limit ...]
[--data KEY=VALUE ...] [--no-perf-gate] [--json]`: upgrade the fleet batch by batch, each host
gated by its health check and its performance against a baseline measured just before, a failed
host rolled back to its previous release. Exit 0 all upgraded, 1 some rolled back, untouched or
held on the new release because the performance gate was inconclusive, 4 a host needs attention (docs/day2.md, Exit codes)."""

from __future__ import annotations

import json
import logging
import textwrap

from rich.console import Console

from servefleet.cli.args import parse_data
from servefleet.cli.output import table
from servefleet.verbs.rollout import Rollout
from servefleet.verbs.rollout_report import RolloutReport


def register(sub) -> None:
    p = sub.add_parser("rollout", help="upgrade in health-gated batches, rolling back failures")
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--batch", default="1", help="hosts per batch: N or P%% (default 1)")
    p.add_argument(
        "--max-failures",
        type=int,
        default=0,
        help="failed hosts tolerated before the rollout stops (default 0)",
    )
    p.add_argument("--limit", action="append", help="host name, glob or group (repeatable)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--no-perf-gate",
        action="store_true",
        help="health gate only: no bench before and after each host's upgrade",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def render(report: RolloutReport) -> str:
    rows = [
        (
            h.name,
            f"{h.from_release or '-'} -> {h.to_release or '-'}",
            h.result,
            "-" if h.converge_s is None else f"{h.converge_s:.0f}",
            "-" if h.gate_s is None else f"{h.gate_s:.0f}",
            "-" if h.perf_s is None else f"{h.perf_s:.0f}",
            "-" if h.rollback_s is None else f"{h.rollback_s:.0f}",
            h.detail or "",
        )
        for h in report.hosts.values()
    ]
    body = table(
        ("host", "from -> to", "result", "conv s", "gate s", "perf s", "back s", "detail"),
        rows,
        shrink=("from -> to", "detail"),
    )
    # The performance gate's verdicts in full: both figures of each comparison.
    perf = "".join(
        f"\n{h.name}: {h.perf}" for h in report.hosts.values() if h.perf and h.perf_after
    )
    message = textwrap.fill(report.message, 80, subsequent_indent="  ") if report.message else ""
    if not report.hosts:  # refused before any host: the reason alone, no empty table
        return f"{message}\nrollout {report.rollout_id}: exit {int(report.exit_code)}"
    tail = perf + (f"\n{message}" if message else "")
    return f"{body}{tail}\nrollout {report.rollout_id}: exit {int(report.exit_code)}"


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)  # our progress is the output
    console = Console(stderr=args.json, highlight=False)
    with console.status("preflight: data, reachability, health") as status:

        def say(line: str) -> None:
            console.print(f"  {line}", markup=False)
            status.update(line)

        report = Rollout(
            args.inventory,
            args.deploy,
            args.batch,
            args.max_failures,
            args.limit,
            parse_data(args.data),
            say,
            perf_gate=not args.no_perf_gate,
        ).run()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    return int(report.exit_code)
