"""`servefleet demo`: the whole story on the local testbed, in one go (README's first command).

Hosts up (reached as a sudo user with pinned host keys); both recipes converged through the API
(the spark host serves the tiny checkpoint through the vLLM engine stand-in; the 4090 host
builds llama.cpp and serves the tiny GGUF); converged again with nothing to change; the drift
report (all in sync); one injected drift caught and fixed; the bench of both nodes; the status.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from servefleet.cli import progress
from servefleet.cli.bench import render as render_bench
from servefleet.cli.drift import render as render_drift
from servefleet.cli.status import render as render_status
from servefleet.core.errors import InputError
from servefleet.core.layout import LLAMA_UNIT, NodeLayout
from servefleet.verbs import drift
from servefleet.verbs.bench import bench
from servefleet.verbs.session import converge
from servefleet.verbs.status import status
from servefleet_dev.testbed import hosts as tb_hosts, lifecycle, material
from servefleet_dev.testbed.root import EXIT_NEEDS_ROOT, needs_root
from servefleet_dev.testbed.state import load_state

INVENTORY = "inventory/testbed.py"
RECIPES = ("deploys/serve_bf16.py", "deploys/serve_q4_llamacpp.py")


def register(sub) -> None:
    p = sub.add_parser("demo", help="bring the testbed up and show every servefleet job on it")
    p.add_argument("--hosts", default=",".join(lifecycle.DEFAULT_HOSTS))
    p.add_argument("--bench-runs", type=int, default=3)
    p.set_defaults(func=run)


def _converge(console: Console, deploy: str, limit: list[str] | None = None) -> bool:
    # Minutes on a first run: the status line says which operation runs, and for how long.
    with progress.status(console, f"converging {deploy}") as line:
        outcomes = converge(INVENTORY, deploy, limit, on_operation=line.detail)
    for name, o in sorted(outcomes.items()):
        verdict = "[green]ok[/]" if o.ok else f"[red]FAILED[/]: {o.error}"
        console.print(
            f"  {deploy} on {name}: {o.changed} of {o.operations} operations changed -> {verdict}"
        )
    return bool(outcomes) and all(o.ok for o in outcomes.values())


def _drift(console: Console, deploy: str) -> int:
    with progress.status(console, f"checking drift against {deploy}"):
        report = drift.check(INVENTORY, deploy)
    console.print(render_drift(report), markup=False, highlight=False)
    return int(report.exit_code)


def _ssh(name: str, command: str) -> None:
    subprocess.run([*tb_hosts.ssh_args(load_state().hosts[name]), command], check=True)


def _logged(console: Console, line: progress.Line):
    """A log callback: the message on the console, and as the status line's detail."""

    def log(message: str) -> None:
        console.print(f"  {message}", markup=False, highlight=False)
        line.detail(message)

    return log


def run(args) -> int:
    refused = needs_root("servefleet demo")
    if refused:
        print(refused, file=sys.stderr)
        return EXIT_NEEDS_ROOT
    if not Path(INVENTORY).is_file():  # before the testbed comes up, not after
        raise InputError(f"no {INVENTORY} in {Path.cwd()}: run from the repository root")
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    console = Console()
    names = [h for h in args.hosts.split(",") if h]
    llama_host = next((n for n in names if n.startswith("rtx4090")), None)
    serving = [n for n in names if n.startswith(("rtx4090", "spark"))]

    console.rule("1. Testbed up: real Debian 12 hosts (systemd-nspawn), reached as a sudo user")
    # The first run builds the base image and llama.cpp on this machine: minutes of silence
    # without the status line.
    with progress.status(console, "bringing the testbed up") as line:
        lifecycle.up(names, log=_logged(console, line))
        line.phase("preparing the test material (models, wheels, llama.cpp host build)")
        material.prepare(log=_logged(console, line))

    console.rule("2. Converge both recipes (first run on a machine: llama.cpp builds, minutes)")
    ok = all(
        [_converge(console, "deploys/base.py", ["depot"])]
        + [_converge(console, d) for d in RECIPES]
    )

    console.rule("3. Converge again: nothing to change")
    ok = all([ok] + [_converge(console, d) for d in RECIPES])

    console.rule("4. Drift check: every host in sync")
    codes = [_drift(console, d) for d in RECIPES]

    if llama_host:
        console.rule(f"5. Inject drift: hand-edit the unit on {llama_host}; check; converge")
        unit = NodeLayout.unit_path(LLAMA_UNIT)
        _ssh(llama_host, f"sed -i 's/^RestartSec=.*/RestartSec=1/' {unit}")
        caught = _drift(console, "deploys/serve_q4_llamacpp.py") == 1
        console.print(f"  drift caught: {'[green]yes[/]' if caught else '[red]NO[/]'}")
        ok = ok and caught and _converge(console, "deploys/serve_q4_llamacpp.py")
        ok = ok and _drift(console, "deploys/serve_q4_llamacpp.py") == 0

    if serving:
        console.rule(f"6. Bench the serving nodes ({args.bench_runs} runs, tiny models)")
        with progress.status(console, f"benching {', '.join(serving)}"):
            results = bench(
                INVENTORY, serving, runs=args.bench_runs, prompt_tokens=256, max_tokens=64
            )
        console.print(render_bench(results, args.bench_runs, 64), markup=False, highlight=False)
        ok = ok and all(r.ok for r in results)

    console.rule("7. Status")
    with progress.status(console, "reading each node's status"):
        nodes = status(INVENTORY)
    console.print(render_status(nodes), markup=False, highlight=False)
    console.print(
        "The testbed stays up: `servefleet testbed ssh NAME`, "
        "`pyinfra inventory/testbed.py DEPLOY`, `servefleet testbed down`."
    )
    return 0 if ok and all(c == 0 for c in codes) else 1
