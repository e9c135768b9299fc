"""Where a command's CPU goes: the CPU time of every process that ran while the command ran, summed
by what the process is (in a testbed guest or on the machine; its program; a Python's role).

    python3 benchmarks/cpu_by_process.py --out /tmp/cpu.json -- bash .ci/run   # run and measure
    python3 benchmarks/cpu_by_process.py --report /tmp/cpu.json                 # the table again

Prints the machine's busy and idle CPU time over the run, the CPU minutes of each kind of process
and their share of the busy time, and the run's minutes by how busy the machine was. Every process
on the machine counts, the command's or not: run it on an otherwise quiet machine. Needs root and
nothing beyond Python's own library (it can run before ./bin/setup).

How: the kernel's process accounting (acct(2), a record with the exact user and system time of
each process as it exits; a guest's processes are recorded too, under the machine's PIDs), and
for processes still running at the end, /proc's own times then (less what they had at the start).
/proc is also read every --interval seconds to learn what each process is (its PID namespace: a
guest's or the machine's; a Python's command line); a process that lives less than that is named
after its nearest known ancestor's kind: "guest: sh (under python (health.py))".
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

HZ = os.sysconf("SC_CLK_TCK")
AHZ = 100  # acct_v3's time unit
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")  # include/uapi/linux/acct.h, struct acct_v3
PYTHON_ROLES = (  # (a word in the command line, the role), first match wins; else its script
    ("pyinfra", "pyinfra"),
    ("servefleet.cli", "servefleet CLI"),
    ("servefleet_dev.testing.prefetch", "prefetch"),
    ("xdist", "pytest worker"),
    ("pytest", "pytest"),
)


def python_role(argv: list[str]) -> str:
    """What a Python runs: a role above, `-m module`, `-c`, or its script's file name."""
    words = " ".join(argv)
    role = next((r for w, r in PYTHON_ROLES if w in words), None)
    if role:
        return role
    args = iter(argv[1:])
    for a in args:
        if a == "-m":
            return f"-m {next(args, '')}"
        if a == "-c":
            return "-c"
        if not a.startswith("-"):
            return os.path.basename(a)
    return "?"


def comp_t(v: int) -> int:
    """acct's 16-bit float: 13 bits of mantissa, 3 of base-8 exponent."""
    return (v & 0x1FFF) << (3 * (v >> 13))


def what(pid: str, comm: str, host_ns: str) -> tuple[str, str]:
    """(where, name): 'guest' or 'host', and the program (a Python with its role)."""
    try:
        where = "guest" if os.readlink(f"/proc/{pid}/ns/pid") != host_ns else "host"
    except OSError:
        where = "?"
    if not comm.startswith("python"):
        return where, comm
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    return where, f"python ({python_role([a for a in argv if a])})"


def snapshot(host_ns: str, known: dict) -> dict:
    """pid -> (own ticks, ppid, start) of every process; new ones (or exec'd) into `known`."""
    seen = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        end = s.rindex(")")
        comm, f = s[s.index("(") + 1 : end], s[end + 2 :].split()
        seen[int(d)] = (int(f[11]) + int(f[12]), int(f[1]), int(f[19]))
        if known.get(int(d), ("", "", ""))[2] != comm:
            known[int(d)] = (*what(d, comm, host_ns), comm)
    return seen


def cpu_line() -> list[int]:
    return [int(x) for x in open("/proc/stat").readline().split()[1:]]


def run(cmd: list[str], interval: float) -> dict:
    host_ns = os.readlink("/proc/self/ns/pid")
    libc = ctypes.CDLL(None, use_errno=True)
    fd, acct_path = tempfile.mkstemp(prefix="cpu_by_process.", suffix=".acct")
    os.close(fd)
    known: dict = {}  # pid -> (where, name, comm) as last seen
    parents: dict = {}  # pid -> ppid as last seen
    if libc.acct(acct_path.encode()) != 0:
        raise SystemExit(f"acct({acct_path}): {os.strerror(ctypes.get_errno())} (needs root)")
    try:
        t0, cpu0 = time.time(), cpu_line()
        start = snapshot(host_ns, known)
        timeline = [(0.0, cpu0)]
        proc = subprocess.Popen(cmd)
        while proc.poll() is None:
            time.sleep(interval)
            now = snapshot(host_ns, known)
            parents.update({pid: v[1] for pid, v in now.items()})
            timeline.append((round(time.time() - t0, 1), cpu_line()))
        end = snapshot(host_ns, known)
        timeline.append((round(time.time() - t0, 1), cpu_line()))
    finally:
        libc.acct(None)
    raw = open(acct_path, "rb").read()
    os.unlink(acct_path)
    exited = []
    for off in range(0, len(raw) - ACCT_V3.size + 1, ACCT_V3.size):
        r = ACCT_V3.unpack_from(raw, off)
        user, system = (comp_t(r[i]) / AHZ * HZ for i in (10, 11))
        comm = r[18].split(b"\0")[0].decode(errors="replace")
        exited.append((r[6], r[7], comm, user + system, system))
        parents.setdefault(r[6], r[7])

    def kind(pid: int, comm: str) -> str:
        if pid in known and known[pid][2] == comm:
            return f"{known[pid][0]}: {known[pid][1]}"
        p, hops = parents.get(pid), 0
        while p and p not in known and hops < 20:
            p, hops = parents.get(p), hops + 1
        if p in known:
            return f"{known[p][0]}: {comm} (under {known[p][1]})"
        return f"?: {comm}"

    ticks: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()  # processes of each kind
    system: collections.Counter = collections.Counter()  # the kernel's share (exited ones)
    for pid, _ppid, comm, t, sys_t in exited:
        k = kind(pid, comm)
        ticks[k] += t
        counts[k] += 1
        system[k] += sys_t
    for pid, (own, _ppid, st) in end.items():  # still running: what it used during the run
        before = start.get(pid)
        k = kind(pid, known[pid][2])
        ticks[k] += own - before[0] if before and before[2] == st else own
        counts[k] += 1
    return {
        "command": cmd,
        "rc": proc.returncode,
        "wall_s": time.time() - t0,
        "hz": HZ,
        "cpus": os.cpu_count(),
        "processes": len(exited) + len(end),
        "ticks": dict(ticks),
        "counts": dict(counts),
        "system": dict(system),
        "timeline": timeline,
    }


def busy_idle(line: list[int]) -> tuple[int, int]:
    """/proc/stat's cpu line: busy (user nice system irq softirq steal) and idle (idle iowait)."""
    return sum(line[0:3]) + sum(line[5:8]), line[3] + line[4]


def report(doc: dict, rows: int = 30) -> None:
    hz, tl = doc["hz"], doc["timeline"]
    (b0, i0), (b1, i1) = busy_idle(tl[0][1]), busy_idle(tl[-1][1])
    busy, idle = b1 - b0, i1 - i0
    counted = sum(doc["ticks"].values())
    print(f"command: {' '.join(doc['command'])} (exit {doc['rc']})")
    print(
        f"wall {doc['wall_s'] / 60:.1f} min on {doc['cpus']} CPUs: busy {busy / hz / 60:.1f} "
        f"CPU-min, idle {idle / hz / 60:.1f}; by process {counted / hz / 60:.1f} CPU-min "
        f"({doc['processes']} processes)"
    )
    # Kernel time (fork, exec, namespaces, the network) is part of the busy time too.
    user, nice, system = (tl[-1][1][i] - tl[0][1][i] for i in range(3))
    print(
        f"user {user / hz / 60:.1f} CPU-min, nice {nice / hz / 60:.1f}, "
        f"system {system / hz / 60:.1f}"
    )
    # By kind of process, then by program wherever it ran.
    by_program: collections.Counter = collections.Counter()
    for k, v in doc["ticks"].items():
        by_program[k.split(": ", 1)[1].split(" (under")[0]] += v
    for title, table in (("process", doc["ticks"]), ("program, wherever it ran", by_program)):
        print(f"\n| CPU-min | share of busy | {title} |\n|---:|---:|---|")
        for k, v in sorted(table.items(), key=lambda kv: -kv[1])[:rows]:
            print(f"| {v / hz / 60:.2f} | {100 * v / max(busy, 1):.1f} % | {k} |")
    counts = doc.get("counts", {})  # runs measured before processes were counted have none
    if counts:
        system = doc.get("system", {})
        print(
            "\n| processes | CPU-min | of it system | kind (most started) |\n|---:|---:|---:|---|"
        )
        for k, n in sorted(counts.items(), key=lambda kv: -kv[1])[:rows]:
            t, st = doc["ticks"].get(k, 0) / hz / 60, system.get(k, 0) / hz / 60
            print(f"| {n} | {t:.2f} | {st:.2f} | {k} |")
    # The run's minutes by how busy the machine was (all CPUs busy: the work waited on CPU).
    bands: collections.Counter = collections.Counter()
    for (t_a, a), (t_b, b) in zip(tl, tl[1:], strict=False):
        (ba, ia), (bb, ib) = busy_idle(a), busy_idle(b)
        total = (bb - ba) + (ib - ia)
        bands[min(4, int(5 * (bb - ba) / total)) if total else 0] += t_b - t_a
    print("\n| machine busy | minutes |\n|---|---:|")
    for band in range(5):
        print(f"| {band * 20}-{band * 20 + 20} % | {bands[band] / 60:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", help="write the measurements to this JSON file")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a saved run")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between /proc reads")
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument("command", nargs="*")
    args = ap.parse_args()
    if args.report:
        report(json.load(open(args.report)), args.rows)
        return 0
    if not args.command:
        ap.error("a command to run, after --")
    doc = run(args.command, args.interval)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f)
    report(doc, args.rows)
    return doc["rc"]


if __name__ == "__main__":
    sys.exit(main())
