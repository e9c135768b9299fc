"""A CPU-only `llama-server` built on this machine from one of the llama.cpp mirror's sources.

Tests use it to prove that a GGUF really loads (or really fails) in the real loader. Each source
(llama_src: `b9785`, the real release and the testbed's pin) is
built once into the cache by the recipe's build.sh (~8.5 min cold on 2 cores; a source the
testbed's guests compiled first comes out of their ccache) and reused:

    ~/.cache/servefleet/src/*.tar.gz                                   (the sdists, llama_src.sdist)
    ~/.cache/servefleet/testbed/shared/git/llama.cpp.git               (the mirror, llama_src)
    ~/.cache/servefleet/llama-host-build/TAG/src/                      (build.sh's clone at TAG)
    ~/.cache/servefleet/llama-host-build/TAG/prefix/bin/llama-server   (+ build.json)
    ~/.cache/servefleet/llama-host-build/TAG/stamp.json                (tag, commit, flags, seconds)
    ~/.cache/servefleet/testbed/shared/ccache/                         (the guests' ccache too)

    python -m servefleet_dev.testing.llama_build [TAG]      # build (when needed), print the path
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from servefleet.core.groupdata import load_group
from servefleet.core.paths import cache_subdir
from servefleet.engines.llamacpp.logic import build_env, flags_hash
from servefleet_dev.testing import llama_src
from servefleet_dev.testing.llama_src import RELEASE_TAG, TAG  # noqa: F401

# One flag set for this build and the testbed's (group_data/testbed_llamacpp.py), one tree layout
# (src/ and build/ side by side under one base, as build.sh has them on a node) and one ccache
# (the one the guests use): whichever builds a source first, the other compiles from the cache.
TESTBED_GROUP = "testbed_llamacpp"
REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "files" / "llamacpp" / "build.sh"
ENV_OVERRIDE = "SERVEFLEET_LLAMA_SERVER"  # an existing binary for the default source


def _launcher_flags() -> list[str]:
    if shutil.which("ccache"):
        return ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return []


def shared_ccache() -> Path:
    # = servefleet_dev.testbed.state.shared_dir() / "ccache", the guests' llamacpp_ccache_dir
    # (not imported, as llama_src.testbed_mirror says why)
    return cache_subdir("testbed") / "shared" / "ccache"


def cmake_flags(tag: str = TAG) -> list[str]:
    """-DKEY=VALUE of the testbed's llamacpp_cmake_flags, in build_env's (sorted) order."""
    flags = load_group(TESTBED_GROUP, REPO)["llamacpp_cmake_flags"]
    return [f"-D{k}={v}" for k, v in sorted(flags.items())]


def _identity(tag: str, commit: str) -> dict:
    """What the cached build was made from: another commit or other flags mean rebuild."""
    return {"tag": tag, "commit": commit, "cmake_flags": cmake_flags(tag)}


def build_root(tag: str = TAG) -> Path:
    return cache_subdir("llama-host-build") / llama_src._source(tag).tag


def build_record(tag: str = TAG) -> dict | None:
    """The stamp of tag's cached build (identity + build_seconds), or None when there is none."""
    stamp = build_root(tag) / "stamp.json"
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


def llama_host_build(jobs: int = 2, tag: str = TAG, mirror: Path | None = None) -> Path:
    """Path of a CPU llama-server built from tag's commit in the llama.cpp mirror (default: the
    testbed's, llama_src.testbed_mirror()); builds it into the cache first when missing.

    The build is the recipe's own: files/llamacpp/build.sh with the environment
    servefleet.engines.llamacpp.logic.build_env gives it, the testbed's flags and the guests' ccache, so
    a source the guests compiled comes out of the cache here, and the other way round.
    A file lock makes concurrent callers (parallel test workers) wait for one build.
    Set SERVEFLEET_LLAMA_SERVER to use an existing binary for the default source instead.
    """
    tag = llama_src._source(tag).tag
    override = os.environ.get(ENV_OVERRIDE)
    if override and tag == TAG:
        return Path(override)
    mirror = Path(mirror) if mirror else llama_src.testbed_mirror()
    commit = llama_src.commits(mirror, tags=(tag,))[tag]
    identity = _identity(tag, commit)
    root = build_root(tag)
    prefix = root / "prefix"
    binary = prefix / "bin" / "llama-server"
    stamp = root / "stamp.json"
    root.mkdir(parents=True, exist_ok=True)

    def up_to_date() -> bool:
        record = build_record(tag) or {}
        return binary.exists() and {k: record.get(k) for k in identity} == identity

    if up_to_date():
        return binary
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if up_to_date():  # another caller built it while we waited
            return binary
        stamp.unlink(missing_ok=True)
        for old in ("llama.cpp", "build"):  # an older layout's trees
            shutil.rmtree(root / old, ignore_errors=True)
        flags = load_group(TESTBED_GROUP, REPO)["llamacpp_cmake_flags"]
        env = build_env(
            git_url=str(mirror),
            commit=commit,
            tag=tag,
            flags_hash=flags_hash(commit, flags),
            src_dir=str(root / "src"),
            build_dir=str(root / "build"),
            prefix=str(prefix),
            cmake_flags=flags,
            launcher_args=_launcher_flags(),
            jobs=jobs,
            ccache_dir=str(shared_ccache()),
        )
        started = time.monotonic()
        subprocess.run(["sh", str(BUILD_SCRIPT)], check=True, env={**os.environ, **env})
        if not binary.exists():
            raise RuntimeError(f"llama.cpp build finished but {binary} is missing")
        stamp.write_text(
            json.dumps({**identity, "build_seconds": round(time.monotonic() - started, 1)})
        )
    return binary


if __name__ == "__main__":
    print(llama_host_build(tag=sys.argv[1] if len(sys.argv) > 1 else TAG))
