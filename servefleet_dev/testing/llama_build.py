"""A CPU-only `llama-server` built on this machine from one of the llama.cpp mirror's sources.

Tests use it to prove that a GGUF really loads (or really fails) in the real loader. Each source
(llama_src.SOURCES: `llama-cpp-python-0.3.36`, the default, and `b9785`, the real release) is
built once into the cache (~8.5 min cold on 2 cores, much less with a warm ccache) and reused:

    ~/.cache/servefleet/src/*.tar.gz                                   (the sdists, llama_src.sdist)
    ~/.cache/servefleet/testbed/shared/git/llama.cpp.git               (the mirror, llama_src)
    ~/.cache/servefleet/llama-host-build/TAG/llama.cpp/                (git archive of TAG's commit)
    ~/.cache/servefleet/llama-host-build/TAG/llama.cpp/build/bin/llama-server
    ~/.cache/servefleet/llama-host-build/TAG/stamp.json                (tag, commit, flags, seconds)
    ~/.cache/servefleet/ccache/                                        (CCACHE_DIR of these builds)

    python -m servefleet_dev.testing.llama_build [TAG]      # build (when needed), print the path
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from servefleet.core.paths import cache_subdir
from servefleet_dev.testing import llama_src
from servefleet_dev.testing.llama_src import LLAMA_CPP_PYTHON_VERSION, RELEASE_TAG, TAG  # noqa: F401

CMAKE_FLAGS = [
    "-DGGML_CUDA=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # otherwise the configure step downloads the web UI
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary: no rpath to the build tree
    "-DGGML_NATIVE=OFF",  # the cache may be shared with a machine of another CPU
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
]
# Per source, on top of CMAKE_FLAGS. b9785's LLAMA_BUILD_UI defaults to ON (0.3.36's to OFF):
# where npm exists, the server build then runs `npm install` and `npm run build` of the web UI.
SOURCE_FLAGS = {RELEASE_TAG: ["-DLLAMA_BUILD_UI=OFF"]}
ENV_OVERRIDE = "SERVEFLEET_LLAMA_SERVER"  # an existing binary for the default source


def _sdist() -> Path:
    """The llama-cpp-python sdist in the cache (kept for older callers: llama_src.sdist)."""
    return llama_src.sdist(TAG)


def _launcher_flags() -> list[str]:
    if shutil.which("ccache"):
        return ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return []


def _ccache_env(root: Path) -> dict[str, str]:
    """ccache under the servefleet cache; paths under llama-host-build/ are hashed relative to the
    compiler's cwd, so a rebuild in a fresh tree (same tag or another) hits for unchanged files."""
    return {"CCACHE_DIR": str(cache_subdir("ccache")), "CCACHE_BASEDIR": str(root.parent),
            "CCACHE_NOHASHDIR": "1"}


def cmake_flags(tag: str = TAG) -> list[str]:
    return [*CMAKE_FLAGS, *SOURCE_FLAGS.get(tag, [])]


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


def _archive(mirror: Path, commit: str, dest: Path) -> None:
    """The commit's tree from the mirror into dest (must not exist), like a checkout without .git."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.Popen(["git", "--git-dir", str(mirror), "archive", "--format=tar", commit],
                            stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, **kwargs)
    if proc.wait() != 0:
        raise RuntimeError(f"git archive {commit} from {mirror} failed")
    tmp.rename(dest)


def _adopt_legacy_build(root: Path, identity: dict) -> None:
    """Move a build of the old single-source layout (llama-host-build/llama.cpp, built from the
    untrimmed llama-cpp-python sdist: the same compiled files) into TAG/, rather than rebuild."""
    legacy_root = root.parent
    legacy = legacy_root / "llama.cpp"
    old_stamp = json.dumps({"sdist": llama_src.LLAMA_CPP_PYTHON.sdist, "cmake_flags": CMAKE_FLAGS})
    try:
        matches = (legacy_root / "stamp.json").read_text() == old_stamp
    except OSError:
        return
    if identity["tag"] != TAG or not matches or not (legacy / "build/bin/llama-server").exists():
        return
    shutil.rmtree(root / "llama.cpp", ignore_errors=True)
    legacy.rename(root / "llama.cpp")
    (legacy_root / "stamp.json").unlink()
    (root / "stamp.json").write_text(json.dumps({**identity, "adopted": "legacy layout"}))


def llama_host_build(jobs: int = 2, tag: str = TAG, mirror: Path | None = None) -> Path:
    """Path of a CPU llama-server built from tag's commit in the llama.cpp mirror (default: the
    testbed's, llama_src.testbed_mirror()); builds it into the cache first when missing.

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
    source = root / "llama.cpp"
    binary = source / "build" / "bin" / "llama-server"
    stamp = root / "stamp.json"
    root.mkdir(parents=True, exist_ok=True)

    def up_to_date() -> bool:
        record = build_record(tag) or {}
        return binary.exists() and {k: record.get(k) for k in identity} == identity

    if up_to_date():
        return binary
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _adopt_legacy_build(root, identity)
        if up_to_date():  # another caller built it while we waited
            return binary
        stamp.unlink(missing_ok=True)
        shutil.rmtree(source, ignore_errors=True)  # unpacked fresh: the stamp names the commit
        _archive(mirror, commit, source)
        env = {**os.environ, **_ccache_env(root)}
        started = time.monotonic()
        # nice: the build machine is usually shared with other work.
        subprocess.run(
            ["nice", "cmake", "-S", ".", "-B", "build", *cmake_flags(tag), *_launcher_flags()],
            cwd=source, check=True, env=env,
        )
        subprocess.run(
            ["nice", "cmake", "--build", "build", f"-j{jobs}", "--target", "llama-server"],
            cwd=source, check=True, env=env,
        )
        if not binary.exists():
            raise RuntimeError(f"llama.cpp build finished but {binary} is missing")
        stamp.write_text(json.dumps({**identity, "build_seconds": round(time.monotonic() - started, 1)}))
    return binary


if __name__ == "__main__":
    print(llama_host_build(tag=sys.argv[1] if len(sys.argv) > 1 else TAG))
