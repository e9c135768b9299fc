"""What one `servefleet` run costs before it does anything: the CPU time (user + system) of a
command refused right after its arguments are read (an inventory that does not exist), per
command, medians of --runs. The operator's CLI runs once per fleet action (the test command runs
it ~200 times), so its start is most of what a quick command costs.

Run: .venv/bin/python benchmarks/cli_start.py [--runs 9] [--ref DIR]

--ref DIR: a checkout of another commit (`git worktree add /tmp/ref COMMIT`), measured
interleaved with this one from the same venv (its directory first on PYTHONPATH), with the ratio.
Prints a table: command, this checkout's median CPU s (and the reference's, the ratio).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ["status", "drift", "rollout", "bench", "report", "rollback", "--help"]
MAIN = "from servefleet.cli import main; raise SystemExit(main())"


def cpu_of(tree: Path, command: str) -> float:
    """CPU seconds of one `servefleet COMMAND inventory/none.py` run from `tree`."""
    args = [command] if command.startswith("-") else [command, "inventory/none.py"]
    if command in ("drift", "rollout"):
        args.append("deploys/base.py")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-c", MAIN, *args],
        cwd=tree,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--ref", type=Path, help="a checkout of another commit, measured alongside")
    args = ap.parse_args()
    trees = [REPO] + ([args.ref.resolve()] if args.ref else [])
    header = "| command | CPU s (median) |" + (" reference | ratio |" if args.ref else "")
    print(header + "\n|---|---:|" + ("---:|---:|" if args.ref else ""))
    for command in COMMANDS:
        times: dict[Path, list[float]] = {t: [] for t in trees}
        for _ in range(args.runs):
            for tree in trees:  # interleaved: the machine's load falls on both alike
                times[tree].append(cpu_of(tree, command))
        here = statistics.median(times[REPO])
        row = f"| `{command}` | {here:.2f} |"
        if args.ref:
            ref = statistics.median(times[args.ref.resolve()])
            row += f" {ref:.2f} | {here / ref:.2f} |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
