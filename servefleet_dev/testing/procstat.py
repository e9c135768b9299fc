"""What one command costs the machine that runs it: wall time, CPU time (user + sys, its
children included), peak memory and peak open file descriptors. The operator-cost and testbed
benchmarks measure `pyinfra`, `servefleet` and `servefleet testbed` with it.

    m = run_measured([sys.executable, "-m", "servefleet.cli", "status", "inventory/testbed.py"])
    m.cpu_s, m.maxrss_kib, m.peak_fds, m.fd_kinds

CPU and memory come from the kernel's accounting of that one child (os.wait4's rusage: the same
figures resource.getrusage(RUSAGE_CHILDREN) adds up after it, but for this child alone, so
ru_maxrss is its own peak and not the largest of every child this process ever waited for).
Open descriptors are sampled from /proc/PID/fd while it runs (every `sample_s`): a peak shorter
than that can be missed, which is why the benchmarks also run commands under a lowered
RLIMIT_NOFILE (`nofile=`), where any excess fails the command outright.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Measured:
    returncode: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_kib: int  # peak resident set of the process or of any child it waited for
    peak_fds: int  # the most descriptors the process itself held open at one sample
    fd_kinds: dict[str, int] = field(default_factory=dict)  # at that sample: socket, pipe, ...
    peak_tree_fds: int = 0  # with tree=True: the most held by it and its descendants at once
    stdout: str = ""
    stderr: str = ""

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


def fd_kind(target: str) -> str:
    """What a /proc/PID/fd link names, by kind: socket, pipe, eventpoll (anon_inode:[eventpoll]),
    /dev, file (anything else on a filesystem, a directory included)."""
    if target.startswith(("socket:", "pipe:")):
        return target.split(":", 1)[0]
    if target.startswith("anon_inode:"):
        return target.removeprefix("anon_inode:").strip("[]")
    if target.startswith("/dev/"):
        return "/dev"
    if target.startswith("/"):
        return "file"
    return target.split(":", 1)[0] or "?"


def open_fds(pid: int) -> list[str]:
    """The link targets of a process's open descriptors ([] once it is gone)."""
    base = f"/proc/{pid}/fd"
    targets = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        try:
            targets.append(os.readlink(f"{base}/{name}"))
        except OSError:
            continue  # closed between the listing and the read
    return targets


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (through /proc/PID/task/*/children), pid excluded."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _set_nofile(limit: int):
    def apply():  # in the child, before exec
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    return apply


def run_measured(
    cmd: list[str],
    *,
    cwd: str | Path | None = None,
    env: dict | None = None,
    timeout: float | None = None,
    sample_s: float = 0.01,
    tree: bool = False,
    nofile: int | None = None,
) -> Measured:
    """Run cmd to its end and measure it. `tree`: also sample the descendants' descriptors (the
    testbed's ssh and supervisor children). `nofile`: run it under that soft RLIMIT_NOFILE.

    The measuring is done by a small Python process of its own (this module run as a script),
    which starts cmd, samples it and reaps it with wait4: a caller with gevent's patches (what
    imports pyinfra_cli) reaps its children itself, and wait4 would find none. Output goes to
    temporary files, not pipes, so a chatty command never blocks on them."""
    with tempfile.TemporaryDirectory(prefix="procstat-") as tmp:
        spec = {
            "cmd": [str(c) for c in cmd],
            "cwd": str(cwd) if cwd else None,
            "env": env,
            "timeout": timeout,
            "sample_s": sample_s,
            "tree": tree,
            "nofile": nofile,
            "out": f"{tmp}/out",
            "err": f"{tmp}/err",
        }
        Path(tmp, "spec.json").write_text(json.dumps(spec))
        subprocess.run(
            [sys.executable, "-I", __file__, f"{tmp}/spec.json", f"{tmp}/result.json"],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        result = json.loads(Path(tmp, "result.json").read_text())
        return Measured(
            **result,
            stdout=Path(spec["out"]).read_bytes().decode(errors="replace"),
            stderr=Path(spec["err"]).read_bytes().decode(errors="replace"),
        )


def _measure(spec: dict) -> dict:
    """In the measuring process: start, sample and reap the command."""
    nofile = spec["nofile"]
    with open(spec["out"], "wb") as out, open(spec["err"], "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            spec["cmd"],
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=_set_nofile(nofile) if nofile else None,
        )
    peak, kinds, peak_tree = 0, Counter(), 0
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        targets = open_fds(proc.pid)
        if len(targets) > peak:
            peak, kinds = len(targets), Counter(fd_kind(t) for t in targets)
        if spec["tree"]:
            total = len(targets) + sum(len(open_fds(p)) for p in descendants(proc.pid))
            peak_tree = max(peak_tree, total)
        timeout = spec["timeout"]
        if timeout is not None and not killed and time.monotonic() - t0 > timeout:
            proc.kill()
            killed = True
        time.sleep(spec["sample_s"])
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
    return {
        "returncode": proc.returncode,
        "wall_s": wall,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "maxrss_kib": usage.ru_maxrss,
        "peak_fds": peak,
        "fd_kinds": dict(kinds.most_common()),
        "peak_tree_fds": peak_tree,
    }


def slope(a: tuple[int, float], b: tuple[int, float]) -> float:
    """What each added host costs between two fleet sizes: (n, figure) pairs."""
    return (b[1] - a[1]) / (b[0] - a[0])


if __name__ == "__main__":  # the measuring process: SPEC.json RESULT.json
    Path(sys.argv[2]).write_text(json.dumps(_measure(json.loads(Path(sys.argv[1]).read_text()))))
