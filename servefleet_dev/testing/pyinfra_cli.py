"""Run pyinfra deploys the way an operator does (its CLI), and read back what changed: the tests'
way to drive a deploy. (servefleet's own verbs converge through the API: servefleet.verbs.session.)"""

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# pyinfra's results table ends with: "Grand total   <ops>   <success>   <error>   <no change>"
_TOTAL = re.compile(r"Grand total\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
REPO_ROOT = Path(__file__).resolve().parents[2]  # the project this dev package ships with


def _num(text: str) -> int:
    return 0 if text == "-" else int(text)


@dataclass
class Run:
    returncode: int
    output: str
    operations: int = 0
    changed: int = 0  # pyinfra's "Success" column: operations that ran commands
    errors: int = 0
    no_change: int = 0
    seconds: float = 0.0  # set by timed()


def pyinfra(
    inventory: str,
    deploy: str,
    *args: str,
    limit: str | None = None,
    data: dict | None = None,
    env: dict | None = None,
    timeout: float | None = None,
    cwd: Path | None = None,
    yes: bool = True,
) -> Run:
    """`pyinfra -y INVENTORY DEPLOY` from the project (files and group_data resolve there).
    yes=False leaves out -y: with --dry, pyinfra then detects changes (reads every fact and
    runs every operation's generator) and executes nothing."""
    cmd = [sys.executable, "-m", "pyinfra"] + (["-y"] if yes else [])
    for name in limit.split(",") if limit else []:  # pyinfra takes one --limit per pattern
        cmd += ["--limit", name]
    for key, value in (data or {}).items():
        cmd += ["--data", f"{key}={value}"]
    cmd += [*args, inventory, deploy]
    proc = subprocess.run(
        cmd,
        cwd=cwd or REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {}), "NO_COLOR": "1"},
    )
    return read_run(proc.returncode, proc.stdout + proc.stderr)


def timed(tag: str, inventory: str, deploy: str, host: str, data: dict | None = None) -> Run:
    """One converge of `host`, timed, its outcome printed under `[tag]` (pytest -s shows it):
    the platform tiers' converges, whose times the docs quote."""
    started = time.monotonic()
    run = pyinfra(inventory, deploy, limit=host, data=data or None, timeout=40 * 60)
    run.seconds = time.monotonic() - started
    print(
        f"[{tag}] {deploy} on {host} {data or ''}: rc {run.returncode}, {run.changed} changed, "
        f"{run.seconds:.0f} s"
    )
    return run


def read_run(returncode: int, output: str) -> Run:
    """A pyinfra CLI run's exit code and output, with its results table's totals."""
    out = _ANSI.sub("", output)
    run = Run(returncode, out)
    match = _TOTAL.search(out)
    if match:
        run.operations, run.changed, run.errors, run.no_change = map(_num, match.groups())
    return run


_COMMAND = re.compile(r"Running command on (\S+?):? \(pty=")


def commands_per_host(log: str) -> dict[str, int]:
    """Commands run on each host, from pyinfra's --debug log (`pyinfra --debug`, or
    `servefleet drift --debug` on stderr): the lines "Running command on HOST: ..."."""
    counts: dict[str, int] = {}
    for m in _COMMAND.finditer(log):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def reads_of_a_noop(inventory: str, deploy: str, host: str, data: dict | None = None) -> dict:
    """Commands a no-op check sends to `host`: `pyinfra --dry --debug` (change detection, no -y)
    and `servefleet drift --debug`. Both must find nothing to change."""
    dry = pyinfra(inventory, deploy, "--dry", "--debug", limit=host, data=data, yes=False)
    assert dry.returncode == 0, dry.output[-3000:]
    cmd = [
        sys.executable,
        "-c",
        "from servefleet.cli import main; raise SystemExit(main())",
        "drift",
        inventory,
        deploy,
        "--limit",
        host,
        "--debug",
    ]
    for key, value in (data or {}).items():
        cmd += ["--data", f"{key}={value}"]
    drift = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert drift.returncode == 0, drift.stdout[-3000:] + drift.stderr[-3000:]
    return {
        "dry": commands_per_host(dry.output).get(host, 0),
        "drift": commands_per_host(drift.stderr).get(host, 0),
    }
