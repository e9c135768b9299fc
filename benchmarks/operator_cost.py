"""The operator's cost per node: CPU time, peak memory and open file descriptors of the process
that checks, reads and upgrades the fleet, at 1, 10 and 50 testbed hosts, projected to 1,000 and
10,000 nodes.

Run: .venv/bin/python benchmarks/operator_cost.py [--sizes 1,10,50] [--runs 3] [--rollout 10]
         [--perf-gate] [--cores 16] [--split 2] [--keep-up]

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set). For each N: N mixed
hosts up (`servefleet testbed up`, measured too), deploys/base.py converged once (measured, not
in the table's medians), then --runs times each of (exit 0 asserted, so every fact is read):
  - `pyinfra --dry inventory/testbed.py deploys/base.py` (the no-op check; change detection on);
  - `servefleet drift inventory/testbed.py deploys/base.py --json`;
  - `servefleet status inventory/testbed.py --json`;
  - the floor, in a process of its own: one SSH login plus `sudo -n true` on every host side by
    side, with the same key, user and pinned known_hosts; with paramiko under gevent as pyinfra
    connects (its pool: 20 per core), and with OpenSSH (one `ssh` process per host, all at once);
  - at the largest N, the no-op check split over --split processes on this machine
    (`--limit` globs on the last digit of the host name: `*[02468]`, `*[13579]`), started
    together.
Each command is measured by servefleet_dev.testing.procstat: wall time, CPU (user + sys, the
process and the children it waited for: wait4's rusage), peak RSS, peak open descriptors (sampled
from /proc/PID/fd every 10 ms) and what they were. With --rollout M: a fresh testbed of M
llama.cpp hosts (rtx4090-1..M, b9785; rtx4090-1 converged first, so only it compiles and the
others build from the shared ccache), then `servefleet rollout --batch 50% --no-perf-gate` (the
gate with --perf-gate) to the mirror's patch release b9785-patch1, measured the same way.

Printed: the per-command table, the cost of each added node (slope between the two largest N),
and the projection to 1,000 and 10,000 nodes on a machine with --cores cores of this machine's
speed: a process runs on one core (gevent: one thread), so one process checking N nodes takes at
least its CPU time, a + b*N; P processes take max(a + b*N/P, (P*a + b*N) / cores). The smallest P
that checks 1,000 nodes in under 60 s is named, with its memory and descriptors per process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from servefleet_dev.testbed import lifecycle, material  # noqa: E402
from servefleet_dev.testing.llama_src import commits  # noqa: E402
from servefleet_dev.testing.procstat import Measured, run_measured, slope  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT  # noqa: E402

INVENTORY, BASE, Q4 = "inventory/testbed.py", "deploys/base.py", "deploys/serve_q4_llamacpp.py"
PY = sys.executable
SERVEFLEET = [PY, "-m", "servefleet.cli"]
FLOOR = str(Path(__file__).with_name("ssh_floor.py"))
CHECKS = {
    "pyinfra --dry": [PY, "-m", "pyinfra", "--dry", INVENTORY, BASE],
    "servefleet drift": [*SERVEFLEET, "drift", INVENTORY, BASE, "--json"],
    "servefleet status": [*SERVEFLEET, "status", INVENTORY, "--json"],
    "floor: paramiko": [PY, FLOOR, "paramiko"],
    "floor: OpenSSH": [PY, FLOOR, "openssh"],
}
NODES = (1_000, 10_000)
BUDGET_S = 60.0
ENV = {**os.environ, "NO_COLOR": "1"}


def run(cmd: list[str], what: str, timeout: float = 3600) -> Measured:
    m = run_measured(cmd, cwd=REPO_ROOT, env=ENV, timeout=timeout)
    if m.returncode != 0:
        raise RuntimeError(f"{what}: exit {m.returncode}\n{(m.stdout + m.stderr)[-3000:]}")
    return m


def testbed(*args: str) -> Measured:
    return run([*SERVEFLEET, "testbed", *args], f"testbed {' '.join(args)[:60]}")


def digit_globs(parts: int) -> list[str]:
    """--limit globs splitting host names by their last digit into `parts` shares."""
    groups = [[d for d in range(10) if d % parts == i] for i in range(parts)]
    return [f"*[{''.join(map(str, g))}]" for g in groups]


def split_check(parts: int) -> dict:
    """The no-op check over `parts` processes started together: wall of the slowest, CPU of
    all, the largest RSS and descriptor peak of one process."""
    cmds = [
        [PY, "-m", "pyinfra", "--dry", "--limit", glob, INVENTORY, BASE]
        for glob in digit_globs(parts)
    ]
    t0 = time.monotonic()
    with ThreadPoolExecutor(parts) as pool:  # gevent's, here: the waits are cooperative
        done = list(pool.map(lambda c: run(c, f"split check {c[5]}"), cmds))
    return {
        "wall": time.monotonic() - t0,
        "cpu": sum(m.cpu_s for m in done),
        "rss_mib": max(m.maxrss_kib for m in done) / 1024,
        "fds": max(m.peak_fds for m in done),
        "per_process_cpu": [round(m.cpu_s, 2) for m in done],
    }


def summarise(samples: list[Measured]) -> dict:
    return {
        "wall": statistics.median(m.wall_s for m in samples),
        "cpu": statistics.median(m.cpu_s for m in samples),
        "rss_mib": max(m.maxrss_kib for m in samples) / 1024,
        "fds": max(m.peak_fds for m in samples),
        "kinds": max(samples, key=lambda m: m.peak_fds).fd_kinds,
    }


def measure(n: int, runs: int, split: int, last: bool) -> dict:
    testbed("down")
    up = testbed("up", "--hosts", ",".join(lifecycle.mixed_names(n)))
    converge = run([PY, "-m", "pyinfra", "-y", INVENTORY, BASE], "converge", timeout=7200)
    rows = {"testbed up": summarise([up]), "first converge (pyinfra -y)": summarise([converge])}
    for name, cmd in CHECKS.items():
        rows[name] = summarise([run(cmd, name) for _ in range(runs)])
    result = {"n": n, "rows": rows}
    if last and split > 1 and n >= 10:
        result["split"] = split_check(split)
    return result


def rollout(m: int, perf_gate: bool) -> dict:
    hosts = [f"rtx4090-{i}" for i in range(1, m + 1)]
    testbed("down")
    testbed("up", "--hosts", ",".join(hosts))
    material.prepare(spark=False, log=lambda s: None)
    first = run([PY, "-m", "pyinfra", "-y", "--limit", "rtx4090-1", INVENTORY, Q4], "first build")
    rest = run([PY, "-m", "pyinfra", "-y", INVENTORY, Q4], "converge", timeout=7200)
    newer = ["--data", "llamacpp_tag=b9785-patch1"]
    newer += ["--data", f"llamacpp_commit={commits()['b9785-patch1']}"]
    cmd = [*SERVEFLEET, "rollout", INVENTORY, Q4, "--limit", "rtx4090-*", "--batch", "50%"]
    cmd += [*newer, "--json"] + ([] if perf_gate else ["--no-perf-gate"])
    done = run(cmd, "rollout", timeout=7200)
    report = json.loads(done.stdout)
    assert report["summary"].get("upgraded") == m, report["summary"]
    return {
        "n": m,
        "first build (pyinfra -y, rtx4090-1)": summarise([first]),
        "converge of the rest (pyinfra -y)": summarise([rest]),
        "rollout": summarise([done]),
        "summary": report["summary"],
    }


def fit(results: list[dict], name: str, key: str) -> tuple[float, float]:
    """(fixed, per node) of a figure, from the two largest fleet sizes measured."""
    a, b = results[-2], results[-1]
    per = slope((a["n"], a["rows"][name][key]), (b["n"], b["rows"][name][key]))
    return b["rows"][name][key] - per * b["n"], per


def project(results: list[dict], cores: int) -> list[str]:
    lines = []
    for name in ("pyinfra --dry", "servefleet drift", "servefleet status", "floor: paramiko"):
        a, b = fit(results, name, "cpu")
        r0, r1 = fit(results, name, "rss_mib")
        f0, f1 = fit(results, name, "fds")
        for nodes in NODES:
            one = a + b * nodes
            procs = next(
                (p for p in range(1, cores + 1) if _wall(a, b, nodes, p, cores) < BUDGET_S), None
            )
            text = (
                f"{name}, {nodes:,} nodes: one process >= {one:,.0f} s CPU "
                f"({r0 + r1 * nodes:,.0f} MiB, {f0 + f1 * nodes:,.0f} fds)"
            )
            if procs and procs > 1:
                text += (
                    f"; under {BUDGET_S:.0f} s on {cores} cores: {procs} processes, "
                    f"{_wall(a, b, nodes, procs, cores):.0f} s, each "
                    f"{r0 + r1 * nodes / procs:,.0f} MiB and {f0 + f1 * nodes / procs:,.0f} fds"
                )
            elif not procs:
                best = min(range(1, cores + 1), key=lambda p: _wall(a, b, nodes, p, cores))
                text += (
                    f"; not under {BUDGET_S:.0f} s on {cores} cores: best {best} processes, "
                    f"{_wall(a, b, nodes, best, cores):.0f} s "
                    f"(needs {math.ceil((a * best + b * nodes) / BUDGET_S)} cores)"
                )
            lines.append(text)
        lines.append(
            f"  ({name}: {a:.2f} s fixed + {b * 1000:.1f} ms CPU per node, "
            f"{r1 * 1024:.0f} KiB and {f1:.2f} fds per node)"
        )
    return lines


def _wall(a: float, b: float, nodes: int, procs: int, cores: int) -> float:
    return max(a + b * nodes / procs, (procs * a + b * nodes) / cores)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="1,10,50")
    ap.add_argument("--rollout", type=int, default=0, help="llama.cpp hosts to roll out (0: no)")
    ap.add_argument("--perf-gate", action="store_true", help="roll out with the gate")
    ap.add_argument("--cores", type=int, default=16, help="the projection's operator machine")
    ap.add_argument("--split", type=int, default=2, help="processes of the split check")
    ap.add_argument("--keep-up", action="store_true", help="leave the last testbed up")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]  # "": the rollout alone
    results, rolled = [], None
    try:
        for i, n in enumerate(sizes):
            results.append(measure(n, args.runs, args.split, last=i == len(sizes) - 1))
            print_size(results[-1])
        if args.rollout:
            rolled = rollout(args.rollout, args.perf_gate)
    finally:
        if not args.keep_up:
            down = testbed("down")
            print(f"testbed down: {down.wall_s:.1f} s, {down.peak_fds} fds at most")
    if results:
        print_table(results, args.runs)
    if rolled:
        print_rollout(rolled, args.perf_gate)
    if len(results) >= 2:
        for line in project(results, args.cores):
            print(line)


def print_size(r: dict) -> None:
    print(json.dumps(r, default=str), file=sys.stderr)  # the raw figures, as measured


def print_table(results: list[dict], runs: int) -> None:
    table = Table(
        title=f"operator cost per command (medians of {runs}; peaks the largest; "
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')})"
    )
    for col in (
        "hosts",
        "command",
        "wall s",
        "CPU s",
        "CPU ms/host",
        "RSS MiB",
        "fds",
        "fds by kind",
    ):
        table.add_column(col, justify="right" if col not in ("command", "fds by kind") else "left")
    for r in results:
        for name, row in r["rows"].items():
            kinds = ", ".join(f"{k} {v}" for k, v in list(row["kinds"].items())[:4])
            table.add_row(
                str(r["n"]),
                name,
                f"{row['wall']:.2f}",
                f"{row['cpu']:.2f}",
                f"{row['cpu'] / r['n'] * 1000:.0f}",
                f"{row['rss_mib']:.0f}",
                str(row["fds"]),
                kinds,
            )
        if "split" in r:
            s = r["split"]
            table.add_row(
                str(r["n"]),
                f"pyinfra --dry split over {len(s['per_process_cpu'])} processes",
                f"{s['wall']:.2f}",
                f"{s['cpu']:.2f}",
                f"{s['cpu'] / r['n'] * 1000:.0f}",
                f"{s['rss_mib']:.0f} each",
                f"{s['fds']} each",
                f"CPU per process {s['per_process_cpu']}",
            )
    Console(width=160).print(table)
    if len(results) >= 2:
        a, b = results[-2], results[-1]
        for name in CHECKS:
            cpu = slope((a["n"], a["rows"][name]["cpu"]), (b["n"], b["rows"][name]["cpu"]))
            rss = slope((a["n"], a["rows"][name]["rss_mib"]), (b["n"], b["rows"][name]["rss_mib"]))
            fds = slope((a["n"], a["rows"][name]["fds"]), (b["n"], b["rows"][name]["fds"]))
            print(
                f"per added node ({a['n']}->{b['n']}), {name}: {cpu * 1000:.1f} ms CPU, "
                f"{rss * 1024:.0f} KiB, {fds:.2f} fds"
            )


def print_rollout(r: dict, perf_gate: bool) -> None:
    gate = "with the performance gate" if perf_gate else "--no-perf-gate"
    print(f"rollout of {r['n']} llama.cpp hosts to b9785-patch1, batches of 50%, {gate}:")
    for name in (
        "first build (pyinfra -y, rtx4090-1)",
        "converge of the rest (pyinfra -y)",
        "rollout",
    ):
        row = r[name]
        print(
            f"  {name}: {row['wall']:.1f} s wall, {row['cpu']:.2f} s CPU "
            f"({row['cpu'] / r['n'] * 1000:.0f} ms per host), {row['rss_mib']:.0f} MiB, "
            f"{row['fds']} fds"
        )
    print(f"  summary: {r['summary']}")


if __name__ == "__main__":
    main()
