"""The gate tests' background load, paced (servefleet_dev.testing.load.paced): the load runs
while a node-side bench runs anywhere on the machine, and is stopped otherwise. Real processes:
a process group that spins stands for the compile, and the bench is a process whose command line
holds the bench's name, started the way a node starts it (a shell that execs it)."""

import os
import subprocess
import sys
import time

from servefleet_dev.testing.load import BENCH, paced

NAP = "import time; time.sleep(1.5)"  # the bench's time


def states(group: int) -> set[str]:
    """The scheduler states (R, S, T, ...) of the processes of a process group."""
    out = set()
    for pid in os.listdir("/proc"):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group:
            out.add(fields[0])
    return out


def settle(group: int, want: str, timeout: float = 5.0) -> set[str]:
    """The group's states once they are all `want` (T: stopped) or none is, or at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = states(group)
        done = got == {want} if want == "T" else "T" not in got
        if done or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_the_load_runs_only_while_a_bench_runs():
    load = subprocess.Popen(
        ["sh", "-c", "while :; do :; done & while :; do :; done"], start_new_session=True
    )
    try:
        with paced(load, BENCH):
            assert settle(load.pid, "T") == {"T"}  # no bench: stopped
            # The bench as a node starts it: a shell (its own command line without the word)
            # that execs the bench after a while.
            bench = subprocess.Popen(
                ["sh", "-c", f'sleep 0.3; exec {sys.executable} -c "{NAP}" "$W"'],
                env={**os.environ, "W": BENCH},
            )
            assert "T" not in settle(load.pid, "R"), "the load did not run beside the bench"
            bench.wait()
            assert settle(load.pid, "T") == {"T"}  # the bench ended: stopped again
        assert "T" not in settle(load.pid, "R")  # left running, as it was handed over
    finally:
        os.killpg(load.pid, 9)
        load.wait()


def test_a_bench_already_running_finds_the_load_running():
    bench = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)", BENCH])
    load = subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
    try:
        with paced(load, BENCH):
            time.sleep(0.3)
            assert "T" not in states(load.pid)
    finally:
        bench.kill()
        bench.wait()
        os.killpg(load.pid, 9)
        load.wait()
