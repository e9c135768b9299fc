"""`servefleet demo [--json]`: the whole story on the local testbed, in one go (README's first
command), each step checked per host (docs/testbed.md, "The demo").

1. hosts up (reached as a sudo user with pinned host keys); 2. both recipes converged through
the API (the spark host serves the tiny checkpoint through the vLLM engine stand-in; the 4090
host builds llama.cpp and serves the tiny GGUF); 3. converged again with nothing to change;
4. the drift report (all in sync); 5. one injected drift caught and repaired; 6. the bench of
both serving nodes; 7. the status. Every step judges each host from its own result, whatever
the others did (demo_steps); the run ends with the verdicts of every step on every host and
one line that says what passed and what did not, and exits by it (demo_report): 0 every step
passed on every host, 1 a step failed on a host, 3 a host could not be reached (3 wins).

The testbed is the one $SERVEFLEET_TESTBED_INSTANCE names (0 by default).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rich.console import Console

from servefleet.cli import json_report
from servefleet.core.errors import InputError
from servefleet_dev.cli.demo_report import Report
from servefleet_dev.cli.demo_steps import INVENTORY, Demo
from servefleet_dev.testbed import lifecycle, platforms
from servefleet_dev.testbed.root import EXIT_NEEDS_ROOT, needs_root
from servefleet_dev.testbed.state import instance, role_of


def register(sub) -> None:
    p = sub.add_parser("demo", help="bring the testbed up and show every servefleet job on it")
    p.add_argument("--hosts", default=",".join(lifecycle.DEFAULT_HOSTS))
    p.add_argument("--bench-runs", type=int, default=3)
    p.add_argument(
        "--json",
        action="store_true",
        help="the verdicts as one JSON object on stdout (the story goes to stderr)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    refused = needs_root("servefleet demo")
    if refused:
        print(refused, file=sys.stderr)
        return EXIT_NEEDS_ROOT
    if not Path(INVENTORY).is_file():  # before the testbed comes up, not after
        raise InputError(f"no {INVENTORY} in {Path.cwd()}: run from the repository root")
    specs = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:  # `spark-1@trixie` boots a Debian 13 host; the host is spark-1 everywhere else
        names = [platforms.parse(spec).name for spec in specs]
        for name in names:
            role_of(name)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    # Under --json the story goes to stderr and stdout holds the JSON object alone.
    console = Console(stderr=args.json, highlight=False)
    report = Report(list(names), instance())
    demo = Demo(console, report, names, args.bench_runs, specs)
    demo.up()
    demo.converge_all("converge")
    demo.converge_all("again")
    demo.in_sync()
    demo.inject()
    demo.bench()
    demo.status()
    where = f" (with SERVEFLEET_TESTBED_INSTANCE={report.instance})" if report.instance else ""
    for line in (
        "The testbed stays up: `servefleet testbed ssh NAME`, `servefleet testbed down`,",
        f"`pyinfra inventory/testbed.py DEPLOY`{where}.",
    ):
        console.print(line, markup=False, highlight=False)
    console.rule("Verdicts: every step on every host")
    console.print(report.grid(console.width), markup=False, highlight=False)
    # One line, never wrapped by the console: a terminal narrower than it wraps it.
    style = "green" if report.exit_code == 0 else "red"
    console.print(report.final_line(), style=style, markup=False, highlight=False, soft_wrap=True)
    if args.json:
        json_report.emit(report.to_json())
    return int(report.exit_code)
