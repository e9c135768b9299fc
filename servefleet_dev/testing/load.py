"""A background load for the performance gate's tests and benchmark: one llama.cpp compile at
normal priority, restarted whenever it finishes, for as long as the context lasts.

The gate's decision rule has to hold on a node that is busy with something else, so its e2e
tests and benchmarks/perf_gate.py measure beside this, not on a quiet machine. The compile is
llama.cpp b9785's llama-server (the source of the host build, llama_build), `cmake --build -j 2`
into a scratch directory with ccache off, so it really compiles, at the priority a user's build
has.

    with compile_load():
        ...  # measured beside the compile
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
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


@contextmanager
def compile_load(warmup_s: float = 10.0) -> Iterator[subprocess.Popen]:
    """One llama.cpp compile in a loop while the context lasts; it has been compiling for
    warmup_s when the body starts. The process group is killed on exit, its tree removed."""
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
            yield proc
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
