"""The recipe's llama.cpp build script (files/llamacpp/build.sh) through real git, CMake, gcc and
ccache, on a small C project that has llama.cpp's build shape (a `llama-server` target): what
one build compiled is a cache hit for another build of the same source, whatever locale started
it. ccache keys objects on the compiler's message language (LANG, LC_*); a node's build runs
under sudo over SSH with no locale set, while the testbed compiles its pin into the shared cache
from the test session (C.UTF-8) and from a container (systemd-nspawn sets C.UTF-8). Before
build.sh fixed the locale, a freshly booted machine compiled every llama.cpp object twice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servefleet.engines.llamacpp.logic import build_env

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "files" / "llamacpp" / "build.sh"
CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(tiny C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(ggml STATIC ggml.c)
add_executable(llama-server server.c)
target_link_libraries(llama-server ggml)
"""
SOURCES = {
    "ggml.c": "int ggml_twice(int x) { return 2 * x; }\n",
    "server.c": (
        "#include <stdio.h>\nint ggml_twice(int);\n"
        'int main(void) { fprintf(stderr, "version: %d (tiny)\\n", ggml_twice(1)); return 0; }\n'
    ),
}
LOCALE = ("LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES")
STAT = "Hits", "Misses"


@pytest.fixture
def upstream(tmp_path) -> tuple[Path, str]:
    for tool in ("cmake", "ccache", "cc", "git"):
        assert shutil.which(tool), f"{tool} missing: bin/setup installs it"
    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "CMakeLists.txt").write_text(CMAKELISTS)
    for name, text in SOURCES.items():
        (repo / name).write_text(text)
    who = {
        f"GIT_{role}_{key}": "t@t" for role in ("AUTHOR", "COMMITTER") for key in ("NAME", "EMAIL")
    }
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "one"], ["tag", "b1"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env={**os.environ, **who})
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    return repo, sha


def build(tmp_path: Path, upstream, node: str, locale: dict[str, str]) -> dict[str, int]:
    """build.sh into `node`'s own tree with the shared ccache, started with `locale` (and no
    other locale variable); returns this build's own ccache hits and misses."""
    repo, sha = upstream
    tree = tmp_path / node / "llama.cpp"
    stats = tmp_path / f"{node}.ccache-stats"
    env = {k: v for k, v in os.environ.items() if k not in LOCALE and not k.startswith("CCACHE")}
    env |= locale | {"CCACHE_STATSLOG": str(stats)}
    env |= build_env(  # as the recipe's build step gives it
        git_url=str(repo),
        commit=sha,
        tag="b1",
        flags_hash="x",
        src_dir=str(tree / "src"),
        build_dir=str(tree / "build"),
        prefix=str(tree / "b1-x"),
        cmake_flags={"CMAKE_BUILD_TYPE": "Release"},
        launcher_args=["-DCMAKE_C_COMPILER_LAUNCHER=ccache"],
        jobs=1,
        ccache_dir=str(tmp_path / "ccache"),
    )
    done = subprocess.run(["sh", str(BUILD_SH)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((tree / "b1-x" / "build.json").read_text())["version"] == "version: 2 (tiny)"
    shown = subprocess.run(
        ["ccache", "--show-log-stats"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "CCACHE_STATSLOG": str(stats)},
    ).stdout
    counts = {}
    for line in shown.splitlines():
        key, _, rest = line.strip().partition(":")
        if key in STAT and key.lower() not in counts:  # the first: this build's calls
            counts[key.lower()] = int(rest.split("/")[0])
    return counts


@pytest.mark.parametrize(
    "first,second",
    [
        ({"LANG": "C.UTF-8"}, {}),  # the testbed's pin from the test session, then a guest
        ({}, {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}),  # a guest, then a login with a locale
    ],
    ids=["C.UTF-8-then-none", "none-then-C.UTF-8"],
)
def test_a_build_started_in_another_locale_is_all_cache_hits(tmp_path, upstream, first, second):
    cold = build(tmp_path, upstream, "pin", first)
    assert cold == {"hits": 0, "misses": 2}, cold  # ggml.c and server.c, compiled
    warm = build(tmp_path, upstream, "guest", second)
    assert warm == {"hits": 2, "misses": 0}, warm  # the same objects, out of the cache
