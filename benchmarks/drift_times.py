"""Wall time of `servefleet drift` on testbed hosts running deploys/base.py: 1, 5, 10 hosts.

Run: .venv/bin/python benchmarks/drift_times.py [--runs 5] [--sizes 1,5,10]
Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set). Each size: hosts up,
deploys/base.py converged once (not timed), then the drift check timed --runs times (exit 0
asserted: the hosts are in sync, so every operation and fact is really read).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from servefleet_dev.testbed import lifecycle  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import (
    REPO_ROOT,
    pyinfra,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="1,5,10")
    args = ap.parse_args()
    quiet = lambda m: None  # noqa: E731
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            lifecycle.down(log=quiet)
            lifecycle.up(lifecycle.mixed_names(n), log=quiet)
            first = pyinfra("inventory/testbed.py", "deploys/base.py")
            assert first.returncode == 0, first.output[-2000:]
            times = []
            for _ in range(args.runs):
                t0 = time.monotonic()
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "servefleet.cli",
                        "drift",
                        "inventory/testbed.py",
                        "deploys/base.py",
                        "--json",
                    ],
                    cwd=REPO_ROOT,
                    capture_output=True,
                    text=True,
                )
                times.append(time.monotonic() - t0)
                assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            rows.append((n, times))
    finally:
        lifecycle.down(log=quiet)
    table = Table(title=f"servefleet drift wall time, deploys/base.py (median of {args.runs})")
    for col in ("hosts", "median s", "min s", "max s", "s per host"):
        table.add_column(col, justify="right")
    for n, times in rows:
        med = statistics.median(times)
        table.add_row(
            str(n), f"{med:.2f}", f"{min(times):.2f}", f"{max(times):.2f}", f"{med / n:.2f}"
        )
    Console().print(table)


if __name__ == "__main__":
    main()
