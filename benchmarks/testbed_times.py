"""Testbed up time and no-op converge time of deploys/base.py, for 1 and 5 hosts.

Run: .venv/bin/python benchmarks/testbed_times.py [--runs 5] [--sizes 1,5]
Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set), so it does not disturb
a running one. The base image and apt caches are warm after the first round; the first converge
of each size is not timed (it installs packages), the no-op converges are.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from servefleet_dev.testbed import lifecycle  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import pyinfra  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="1,5")
    args = ap.parse_args()
    quiet = lambda m: None  # noqa: E731
    rows = []
    lifecycle.up(
        lifecycle.mixed_names(1), log=quiet
    )  # builds/caches the base image once, outside the timings
    lifecycle.down(log=quiet)
    for n in (int(s) for s in args.sizes.split(",")):
        ups, noops = [], []
        try:
            for _ in range(args.runs):
                lifecycle.down(log=quiet)
                t0 = time.monotonic()
                lifecycle.up(lifecycle.mixed_names(n), log=quiet)
                ups.append(time.monotonic() - t0)
            first = pyinfra("inventory/testbed.py", "deploys/base.py")
            assert first.returncode == 0, first.output[-2000:]
            for _ in range(args.runs):
                t0 = time.monotonic()
                run = pyinfra("inventory/testbed.py", "deploys/base.py")
                noops.append(time.monotonic() - t0)
                assert run.returncode == 0 and run.changed == 0, run.output[-2000:]
        finally:
            lifecycle.down(log=quiet)
        rows.append((n, ups, noops))
    table = Table(title=f"testbed timings (median of {args.runs} runs, seconds; 2-core machine)")
    for col in ("hosts", "up: median", "up: min-max", "no-op converge: median", "min-max"):
        table.add_column(col, justify="right")
    for n, ups, noops in rows:
        table.add_row(
            str(n),
            f"{statistics.median(ups):.2f}",
            f"{min(ups):.2f}-{max(ups):.2f}",
            f"{statistics.median(noops):.2f}",
            f"{min(noops):.2f}-{max(noops):.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
