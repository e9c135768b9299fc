"""A background load for the performance gate's tests and benchmark: one llama.cpp compile at
normal priority, restarted whenever it finishes, for as long as the context lasts.

The gate's decision rule has to hold on a node that is busy with something else, so its e2e
tests and benchmarks/perf_gate.py measure beside this, not on a quiet machine. The compile is
llama.cpp b9785's llama-server (the source of the host build, llama_build), `cmake --build -j 2`
into a scratch directory with ccache off, so it really compiles, at the priority a user's build
has.

    with compile_load():
        ...  # measured beside the compile

    with compile_load(during=BENCH):
        ...  # the compile runs through every measurement of a node-side bench, paused between

`during`: the compile runs while a process whose command line holds that word runs anywhere on
the machine (a guest's included: the host sees every guest's processes), and is stopped
(SIGSTOP) otherwise. The e2e tests use it: a rollout's gate measures for seconds between minutes of
converging, and a compile through those minutes cost the whole test session a core.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servefleet_dev.testing.llama_build import RELEASE_TAG, build_root, llama_host_build

FLAGS = [
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
]
JOBS = 2  # a build as a user starts it on this machine's two cores
BENCH = (
    "servefleet-stream-bench"  # the node-side bench (servefleet.verbs.bench) as the node runs it
)
POLL_S = 0.05  # how soon a bench that starts finds the compile running
EXEC_S = 1.0  # a new process's command line is read again until it is this old (fork, then exec)


@contextmanager
def compile_load(warmup_s: float = 10.0, during: str | None = None) -> Iterator[subprocess.Popen]:
    """One llama.cpp compile in a loop while the context lasts (or, with `during`, while such a
    process runs); it has been compiling for warmup_s when the body starts. The process group is
    killed on exit, its tree removed."""
    llama_host_build(tag=RELEASE_TAG)  # the source tree (cached; built once per machine)
    src = build_root(RELEASE_TAG) / "src"
    work = Path(tempfile.mkdtemp(prefix="servefleet-load-"))
    env = {**os.environ, "CCACHE_DISABLE": "1"}
    try:
        subprocess.run(
            ["cmake", "-S", str(src), "-B", str(work), *FLAGS],
            check=True,
            capture_output=True,
            env=env,
        )
        build = shlex.join(
            [
                "cmake",
                "--build",
                str(work),
                "-j",
                str(JOBS),
                "--clean-first",
                "--target",
                "llama-server",
            ]
        )
        proc = subprocess.Popen(
            ["sh", "-c", f"while true; do {build} >/dev/null 2>&1; done"],
            start_new_session=True,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        try:
            time.sleep(warmup_s)
            if proc.poll() is not None:
                raise RuntimeError(f"the background compile exited ({proc.returncode})")
            if during is None:
                yield proc
            else:
                with paced(proc, during):
                    yield proc
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def paced(proc: subprocess.Popen, word: str) -> Iterator[None]:
    """`proc`'s process group stopped except while a process whose command line holds `word`
    runs on the machine; a thread looks every POLL_S."""
    done = threading.Event()
    pattern = word.encode()
    running = [True]

    def switch(on: bool) -> None:
        if on != running[0]:
            os.killpg(proc.pid, signal.SIGCONT if on else signal.SIGSTOP)
            running[0] = on

    def watch() -> None:
        # PID -> (runs `word`, when first seen), while it lives. A PID is read again for its
        # first second: a process forked by sudo or a shell shows its parent's command line
        # until it execs.
        seen: dict[str, tuple[bool, float]] = {}
        while not done.is_set():
            now = time.monotonic()
            pids = {d for d in os.listdir("/proc") if d.isdigit()}
            for gone in seen.keys() - pids:
                del seen[gone]
            for pid in pids:
                match, first = seen.get(pid, (False, now))
                if match or now - first > EXEC_S:
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        seen[pid] = (pattern in f.read(), first)
                except OSError:  # exited meanwhile
                    pass
            switch(any(match for match, _ in seen.values()))
            done.wait(POLL_S)

    watcher = threading.Thread(target=watch, name="compile-load-pacer", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        switch(True)  # as it was: the caller kills a running group
