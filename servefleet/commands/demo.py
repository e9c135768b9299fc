"""`servefleet demo`: the whole story on the local testbed, in one go (README's first command).

Hosts up; both recipes converged (the spark host provisioned with its service stopped by data,
no GPU here; the 4090 host building llama.cpp and serving the tiny GGUF); converged again with
nothing to change; the drift table (all in sync); one injected drift caught and fixed; the bench
table of the llama.cpp node; the status table.
"""

import logging

from rich.console import Console

from servefleet import drift
from servefleet.bench import bench
from servefleet.commands.bench import print_results
from servefleet.commands.drift import print_report
from servefleet.commands.status import print_status
from servefleet.converge import pyinfra
from servefleet.status import status
from servefleet.testbed import hosts as tb_hosts
from servefleet.testbed import lifecycle, material
from servefleet.testbed.state import load_state

INVENTORY = "inventory/testbed.py"
RECIPES = ("deploys/serve_bf16.py", "deploys/serve_q4_llamacpp.py")
LLAMA_UNIT = "/etc/systemd/system/servefleet-llama.service"


def register(sub) -> None:
    p = sub.add_parser("demo", help="bring the testbed up and show every servefleet job on it")
    p.add_argument("--hosts", default=",".join(lifecycle.DEFAULT_HOSTS))
    p.add_argument("--bench-runs", type=int, default=3)
    p.set_defaults(func=run)


def _converge(console: Console, deploy: str, limit: str | None = None) -> bool:
    result = pyinfra(INVENTORY, deploy, limit=limit, timeout=3600)
    ok = result.returncode == 0
    console.print(f"  {deploy}: {result.operations} operations, {result.changed} changed, "
                  f"{result.errors} errors -> {'[green]ok[/]' if ok else '[red]FAILED[/]'}")
    if not ok:
        console.print(result.output[-4000:])
    return ok


def _drift(console: Console, deploy: str) -> int:
    report = drift.check(INVENTORY, deploy)
    print_report(report, console)
    return report.exit_code


def _ssh(name: str, command: str) -> None:
    import subprocess

    address = load_state().hosts[name].address
    subprocess.run([*tb_hosts.ssh_base_args(), f"root@{address}", command], check=True)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    console = Console()
    names = [h for h in args.hosts.split(",") if h]
    llama_host = next((n for n in names if n.startswith("rtx4090")), None)

    console.rule("1. Testbed up: real Debian 12 hosts (systemd-nspawn)")
    lifecycle.up(names, log=lambda m: console.print(f"  {m}"))
    material.prepare(log=lambda m: console.print(f"  {m}"))

    console.rule("2. Converge both recipes (first run: llama.cpp builds, ~8 min cold)")
    ok = all([_converge(console, "deploys/base.py", limit="depot")]
             + [_converge(console, d) for d in RECIPES])

    console.rule("3. Converge again: nothing to change")
    ok = all([ok] + [_converge(console, d) for d in RECIPES])

    console.rule("4. Drift check: every host in sync")
    codes = [_drift(console, d) for d in RECIPES]

    if llama_host:
        console.rule(f"5. Inject drift: hand-edit the unit on {llama_host}; check; converge")
        _ssh(llama_host, f"sed -i 's/^Restart=.*/Restart=no/' {LLAMA_UNIT}")
        caught = _drift(console, "deploys/serve_q4_llamacpp.py") == 1
        console.print(f"  drift caught: {'[green]yes[/]' if caught else '[red]NO[/]'}")
        ok = ok and caught and _converge(console, "deploys/serve_q4_llamacpp.py")
        ok = ok and _drift(console, "deploys/serve_q4_llamacpp.py") == 0

        console.rule(f"6. Bench the llama.cpp node ({args.bench_runs} runs, tiny model, CPU)")
        results = bench(INVENTORY, [llama_host], runs=args.bench_runs, prompt_tokens=256,
                        max_tokens=64)
        print_results(results, console, args.bench_runs, 64)
        ok = ok and all(r.ok for r in results)

    console.rule("7. Status")
    print_status(status(INVENTORY), console)
    console.print("The testbed stays up: `servefleet testbed ssh NAME`, "
                  "`pyinfra inventory/testbed.py DEPLOY`, `servefleet testbed down`.")
    return 0 if ok and all(c == 0 for c in codes) else 1
