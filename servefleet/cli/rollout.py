"""`servefleet rollout INVENTORY DEPLOY [--batch N|P%] [--max-failures K] [--limit ...]
[--data KEY=VALUE ...] [--no-perf-gate] [--json]`: upgrade the fleet batch by batch, each host
gated by its health check and its performance against a baseline measured just before, a failed
host rolled back to its previous release. Exit 0 all upgraded, 1 some rolled back, untouched or
held on the new release because the performance gate was inconclusive, 4 a host needs attention (docs/day2.md, Exit codes)."""

from __future__ import annotations

import logging
import textwrap

from rich.console import Console

from servefleet.cli import json_report, progress
from servefleet.cli.args import parse_data
from servefleet.cli.output import table, width
from servefleet.verbs.rollout import Rollout
from servefleet.verbs.rollout_report import (
    ATTENTION,
    INCONCLUSIVE,
    ROLLED_BACK,
    UNCHANGED,
    UNTOUCHED,
    UPGRADED,
    RolloutReport,
)

RESULTS = (UPGRADED, UNCHANGED, INCONCLUSIVE, ROLLED_BACK, UNTOUCHED, ATTENTION)


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
    p.add_argument("--wide", action="store_true", help="every column whole, whatever the width")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f}"


def render(report: RolloutReport, wide: bool = False) -> str:
    """80 columns: each host's target release and its result, the detail whole under the table;
    --wide: the release it came from and each phase's seconds too, on one line per host."""
    if wide:
        body = table(
            ("host", "from", "to", "result", "conv s", "gate s", "perf s", "back s", "detail"),
            [
                (
                    h.name,
                    h.from_release or "-",
                    h.to_release or "-",
                    h.result,
                    _s(h.converge_s),
                    _s(h.gate_s),
                    _s(h.perf_s),
                    _s(h.rollback_s),
                    h.detail or "",
                )
                for h in report.hosts.values()
            ],
            max_width=10**6,
        )
    else:  # the detail, whole, goes under the table
        body = table(
            ("host", "release", "result"),
            [(h.name, h.to_release or "-", h.result) for h in report.hosts.values()],
        )
        body += "".join(
            "\n" + textwrap.fill(f"{h.name}: {h.detail}", width(), subsequent_indent="  ")
            for h in report.hosts.values()
            if h.detail and not (h.perf and h.perf_after and h.detail == h.perf)
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
    with progress.status(console, "preflight: data, reachability, health") as status:

        def say(line: str) -> None:
            console.print(f"  {line}", markup=False)
            status.phase(line)  # and the time since it began, while it runs

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
        json_report.emit(to_json(report))
    else:
        print(render(report, wide=args.wide))
    return int(report.exit_code)


def to_json(report: RolloutReport) -> dict:
    """--json (servefleet/cli/json_report.py), rollout's and rollback's: each host's rollout by
    host; the summary counts the hosts by result; a refused rollout's message is its error."""
    doc = report.to_dict()
    return json_report.document(
        doc["hosts"],
        json_report.counts((h.result for h in report.hosts.values()), RESULTS),
        doc["exit_code"],
        error=report.message if report.refused is not None else None,
        rollout_id=doc["rollout_id"],
        message=doc["message"],
    )
