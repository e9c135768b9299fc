"""Fleet-scale cost of a no-op check: N testbed hosts (default 1, 10, 50) running deploys/base.py.

Run: .venv/bin/python benchmarks/scale.py [--sizes 1,10,50] [--runs 5]

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set). For each N: hosts up,
base converged once (not timed), then printed per N:
  - median wall time of --runs no-op `pyinfra --dry inventory/testbed.py deploys/base.py`;
  - median wall time of --runs `servefleet drift inventory/testbed.py deploys/base.py`
    (exit 0 asserted: in sync, so every fact is really read);
  - remote commands per host, counted from pyinfra's debug log ("Running command on HOST"), for
    the --dry run and for drift, and how many of them start a Python interpreter on the node;
  - the cost of each added node: the slope of the --dry median between the two largest N.
Each N is a fresh testbed; if N hosts do not fit the machine, `up` fails and the table stops at
the largest N that did.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from servefleet_dev.testbed import lifecycle  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra  # noqa: E402

INVENTORY, DEPLOY = "inventory/testbed.py", "deploys/base.py"
_COMMAND = re.compile(r"Running command on (\S+): \(pty=\w+\) (.*)")
_PYTHON = re.compile(r"\bpython[0-9.]*\b|/bin/pip\b|\bpip3?\b")


def count_commands(log_text: str) -> tuple[Counter, Counter]:
    """(commands per host, Python-starting commands per host) from pyinfra's debug lines."""
    total, python = Counter(), Counter()
    for line in log_text.splitlines():
        m = _COMMAND.search(line)
        if m:
            host = m.group(1).rstrip(":")
            total[host] += 1
            python[host] += bool(_PYTHON.search(m.group(2)))
    return total, python


def dry(*extra: str) -> str:
    """`pyinfra --dry` as an operator runs it: no -y, so pyinfra detects changes (reads every
    fact and runs every operation generator) and executes nothing. Exit 0 asserted."""
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "--dry", *extra, INVENTORY, DEPLOY],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    assert "Skipping change detection" not in proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def drift(debug: bool = False) -> subprocess.CompletedProcess:
    """`servefleet drift --json` (exit 0 asserted by the caller); with `--debug`, pyinfra's
    debug log on stderr, counted like `pyinfra --debug`'s."""
    cmd = [sys.executable, "-m", "servefleet.cli", "drift", INVENTORY, DEPLOY, "--json"]
    return subprocess.run(
        cmd + (["--debug"] if debug else []), cwd=REPO_ROOT, capture_output=True, text=True
    )


def per_host(counter: Counter, n: int) -> str:
    if not counter:
        return "n/a"  # no debug lines seen
    values = sorted(counter.values())
    lo, hi = values[0], values[-1]
    return f"{lo}" if lo == hi and len(values) == n else f"{lo}-{hi} ({len(values)} hosts)"


def measure(n: int, runs: int) -> dict:
    quiet = lambda m: None  # noqa: E731
    lifecycle.down(log=quiet)
    lifecycle.up(lifecycle.mixed_names(n), log=quiet)
    first = pyinfra(INVENTORY, DEPLOY)
    assert first.returncode == 0, first.output[-2000:]
    dry_times, drift_times = [], []
    for _ in range(runs):
        t0 = time.monotonic()
        dry()
        dry_times.append(time.monotonic() - t0)
        t0 = time.monotonic()
        proc = drift()
        drift_times.append(time.monotonic() - t0)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    dry_cmds, dry_py = count_commands(dry("--debug"))
    proc = drift(debug=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    drift_cmds, drift_py = count_commands(proc.stderr)
    return {
        "n": n,
        "dry": statistics.median(dry_times),
        "drift": statistics.median(drift_times),
        "dry_cmds": per_host(dry_cmds, n),
        "dry_py": per_host(dry_py, n),
        "drift_cmds": per_host(drift_cmds, n),
        "drift_py": per_host(drift_py, n),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="1,10,50")
    args = ap.parse_args()
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            try:
                rows.append(measure(n, args.runs))
            except Exception as exc:  # noqa: BLE001 - report the largest N that fits
                print(f"N={n}: stopped: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
                break
    finally:
        lifecycle.down(log=lambda m: None)
    table = Table(
        title=f"no-op check of {DEPLOY} (medians of {args.runs}; "
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')})"
    )
    for col in (
        "hosts",
        "pyinfra --dry s",
        "servefleet drift s",
        "cmds/host --dry",
        "python starts --dry",
        "cmds/host drift",
        "python starts drift",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["n"]),
            f"{r['dry']:.2f}",
            f"{r['drift']:.2f}",
            r["dry_cmds"],
            r["dry_py"],
            r["drift_cmds"],
            r["drift_py"],
        )
    Console().print(table)
    if len(rows) >= 2:
        a, b = rows[-2], rows[-1]
        print(
            f"per added node (--dry, {a['n']}->{b['n']}): "
            f"{(b['dry'] - a['dry']) / (b['n'] - a['n']):.3f} s; "
            f"drift: {(b['drift'] - a['drift']) / (b['n'] - a['n']):.3f} s"
        )


if __name__ == "__main__":
    main()
