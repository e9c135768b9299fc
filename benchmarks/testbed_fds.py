"""`servefleet testbed up` and `down` of 50 hosts under a lowered open-files limit: fails loudly
(exit 1, what went wrong on stderr) when either runs out of descriptors, holds more than its
bound, or `down` leaves anything of the instance behind.

Run: .venv/bin/python benchmarks/testbed_fds.py [--hosts 50] [--converge]

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set). Measured by
servefleet_dev.testing.procstat (descriptors sampled from /proc/PID/fd every 10 ms):
  1. `up` of --hosts mixed hosts with RLIMIT_NOFILE=UP_NOFILE (its children inherit it; a
     guest's systemd sets its own): the process's own peak, and with its children (the
     supervisors, nspawn, the ssh that waits for each boot);
  2. with --converge, deploys/base.py converged on all of them first (the guests' trees then
     hold thousands of directories each: what `down` of 50 hosts once ran out of descriptors on);
  3. `down` with RLIMIT_NOFILE=DOWN_NOFILE; then nothing of the instance may be left: no process
     (by command line, root or guest overlay), mount, namespace, route, hub or slirp4netns.
Both bounds hold for any number of hosts: `up` waits for BOOT_WAITERS boots at once, `down`
removes each tree with `rm` (servefleet_dev/testbed/trees.py says why not shutil.rmtree).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from servefleet_dev.testbed import lifecycle  # noqa: E402
from servefleet_dev.testbed.leftovers import leftovers  # noqa: E402
from servefleet_dev.testbed.state import testbed_dir  # noqa: E402
from servefleet_dev.testing.procstat import Measured, run_measured  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT  # noqa: E402

UP_NOFILE, UP_BOUND = 256, 80
DOWN_NOFILE, DOWN_BOUND = 64, 32
SERVEFLEET = [sys.executable, "-m", "servefleet.cli"]


def report(what: str, m: Measured, n: int) -> None:
    print(
        f"{what}: exit {m.returncode}, {m.wall_s:.1f} s, {m.cpu_s:.1f} s CPU, "
        f"{m.maxrss_kib / 1024:.0f} MiB; fds at most {m.peak_fds} "
        f"({', '.join(f'{k} {v}' for k, v in m.fd_kinds.items())}), {m.peak_tree_fds} with its "
        f"children ({m.peak_tree_fds / n:.1f} per host)"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--converge", action="store_true")
    args = ap.parse_args()
    n, failures = args.hosts, []

    def testbed(*a: str, nofile: int) -> Measured:
        cmd = [*SERVEFLEET, "testbed", *a]
        return run_measured(cmd, cwd=REPO_ROOT, timeout=3600, tree=True, nofile=nofile)

    lifecycle.down(log=lambda m: None)
    try:
        up = testbed("up", "--hosts", ",".join(lifecycle.mixed_names(n)), nofile=UP_NOFILE)
        report(f"up of {n} hosts (RLIMIT_NOFILE {UP_NOFILE})", up, n)
        if up.returncode != 0:
            failures.append(f"up failed: {up.stderr[-2000:]}")
        if up.peak_fds > UP_BOUND:
            failures.append(f"up held {up.peak_fds} fds (bound {UP_BOUND})")
        if args.converge and up.returncode == 0:
            done = subprocess.run(
                [sys.executable, "-m", "pyinfra", "-y", "inventory/testbed.py", "deploys/base.py"],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                failures.append(f"converge failed: {done.stdout[-1500:]}{done.stderr[-500:]}")
            one = testbed_dir() / "hosts" / "spark-1" / "upper"
            dirs = subprocess.run(
                ["find", str(one), "-type", "d"], capture_output=True, text=True
            ).stdout.count("\n")
            print(f"after the converge, one host's tree holds {dirs} directories")
    finally:
        down = testbed("down", nofile=DOWN_NOFILE)
    report(f"down of {n} hosts (RLIMIT_NOFILE {DOWN_NOFILE})", down, n)
    if down.returncode != 0:
        failures.append(f"down failed: {down.stderr[-2000:]}")
    if down.peak_fds > DOWN_BOUND:
        failures.append(f"down held {down.peak_fds} fds (bound {DOWN_BOUND})")
    left = leftovers()
    if left:
        lifecycle.down(log=lambda m: None)  # clean up for the next run, then fail
        failures.append("left after down: " + "; ".join(left[:20]))
    for line in failures:
        print(f"FAILED: {line}", file=sys.stderr)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
