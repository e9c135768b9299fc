"""The testbed's llama.cpp pin compiled into the guests' shared ccache with a Debian release's own
toolchain, before a guest of that release builds it.

ccache gives an object back only to the compiler that made it (it compares the compiler
binary's size and mtime, then the arguments and every header). This machine's compiler fills
the cache for guests of its own release (servefleet_dev.testing.llama_build, run by
material.pin_in_ccache), but a guest of another release compiles with its own gcc (Debian 12:
gcc 12, Debian 13: gcc 14): every object would be a miss, ~10 min on two shared cores, on the
test tier's critical path. Here that compile runs the way such a guest runs it, in a throw-away
container (systemd-nspawn, no boot, a tmpfs over the read-only base image of that release):

- the recipe's build packages (group data `llamacpp_build_packages` of the node's family, the
  apt options of servefleet.operations.node.os_packages) from the same archive the guests use;
- the recipe's own files/llamacpp/build.sh with the environment the recipe's build step
  (servefleet.engines.llamacpp.steps.build, logic.build_env) makes from the testbed's data: the mirror and the ccache at the guests' paths
  (the shared caches bound at /var/cache/servefleet, as in every guest), the node's tree
  (/opt/servefleet/llama.cpp/src and build), the same flags, jobs and compiler launcher.

The guest later runs every step itself (packages, clone, configure, compile, install); only its
compiles come out of the cache. Nothing here can hand a guest a wrong object: a toolchain that
differs (a point release between the two installs) is a miss, and the guest compiles.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from servefleet.core.groupdata import load_group
from servefleet.core.layout import NodeLayout
from servefleet.core.node import parse_os_release
from servefleet.core.paths import cache_subdir
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet_dev.testbed import image
from servefleet_dev.testbed.hosts import GUEST_CACHE
from servefleet_dev.testbed.platforms import DEFAULT_ARCH, emulated
from servefleet_dev.testbed.state import shared_dir
from servefleet_dev.testing.wheels import cache_lock

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "files" / "llamacpp" / "build.sh"
# A testbed llama.cpp host's data (class, engine, their testbed files, testbed: later wins).
GROUPS = ("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed")
FAMILY = "debian"  # the testbed's guests are Debian's


def testbed_data() -> dict:
    """group_data as a testbed rtx4090 (llama.cpp) host gets it (later groups win)."""
    out: dict = {}
    for name in GROUPS:
        out.update(load_group(name, REPO) or {})
    return out


def machine_release(os_release: Path = Path("/etc/os-release")) -> str | None:
    """This machine's Debian codename, read from its os-release; None on another distribution
    (an Ubuntu machine's gcc is no guest's)."""
    info = parse_os_release(os_release.read_text().splitlines())
    return info.get("version_codename") if info["family"] == FAMILY else None


def needs_own_toolchain(release: str) -> bool:
    """Whether guests of `release` compile with another toolchain than this machine's."""
    return release != machine_release()


def build_root(release: str) -> Path:
    return cache_subdir("llama-release-build") / release


def identity(release: str, base: Path, data: dict) -> dict:
    """What a compile into the cache was made from: anything else means compile again."""
    return {
        "release": release,
        "image": base.name,
        "tag": data["llamacpp_tag"],
        "commit": data["llamacpp_commit"],
        "cmake_flags": llamacpp.cmake_flags(data),
        "packages": data["llamacpp_build_packages"][FAMILY],
    }


def record(release: str) -> dict | None:
    """The stamp of the last compile for `release` (identity, toolchain, seconds), or None."""
    try:
        return json.loads((build_root(release) / "stamp.json").read_text())
    except (OSError, ValueError):
        return None


def guest_env(data: dict) -> dict[str, str]:
    """build.sh's environment as the recipe gives it on a testbed node."""
    lay = NodeLayout.of(data)
    flags, commit = llamacpp.cmake_flags(data), data["llamacpp_commit"]
    return llamacpp.build_env(
        git_url=data["llamacpp_git_url"],
        commit=commit,
        tag=data["llamacpp_tag"],
        flags_hash=llamacpp.flags_hash(commit, flags),
        src_dir=lay.llama_src,
        build_dir=lay.llama_build_dir,
        prefix=lay.llama_prefix(llamacpp.build_name(data)),
        cmake_flags=flags,
        launcher_args=llamacpp.launcher_args(data),
        jobs=data.get("llamacpp_build_jobs"),
        ccache_dir=data.get("llamacpp_ccache_dir"),
    )


# In the container: the packages as servefleet.operations.node.os_packages installs them, the
# toolchain's versions on one line each (recorded), the recipe's build script, and what ccache
# made of this build's compiles (its stats log: hits and misses of this build only).
STATS_LOG = "/opt/servefleet/llama.cpp/ccache-stats.log"
INSTALL = (
    "set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; "
    "apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 {packages} "
    ">/dev/null; for tool in gcc g++ cmake ccache; do printf 'toolchain %s %s\\n' $tool "
    '"$($tool --version | head -n 1)"; done; sh /run/servefleet-build.sh; echo "== ccache"; '
    "ccache --show-log-stats"
)
STAT = re.compile(r"^\s*(Hits|Misses):\s+(\d+)", re.M)


def pin_in_ccache(release: str, log=print) -> dict:
    """Compile the testbed's pin with `release`'s toolchain into the shared ccache, once per
    identity (machine-wide lock: a second caller waits, then finds it done). Returns the stamp."""
    if emulated(DEFAULT_ARCH):
        raise RuntimeError("the testbed's native guests are amd64; this machine is not")
    data = testbed_data()
    base = image.base_image(release, DEFAULT_ARCH, log)
    want = identity(release, base, data)
    root = build_root(release)
    root.mkdir(parents=True, exist_ok=True)

    def done() -> dict | None:
        found = record(release)
        return found if found and {k: found.get(k) for k in want} == want else None

    with cache_lock(f"llama-release-build-{release}"):
        found = done()
        if found:
            return found
        (root / "stamp.json").unlink(missing_ok=True)
        tree = root / "llama.cpp"  # the node's llama.cpp directory, scratch here
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        apt = shared_dir() / "apt" / f"toolchain-{release}"  # as each guest's: apt locks it
        (apt / "partial").mkdir(parents=True, exist_ok=True)
        lay = NodeLayout.of(data)
        env = guest_env(data)
        log(f"llama.cpp {want['tag']}: compiling with {release}'s toolchain into the ccache")
        started = time.monotonic()
        out = subprocess.run(
            [
                "systemd-nspawn",
                "--quiet",
                "--register=no",
                "--keep-unit",  # no scope of its own: nothing to ask a service manager
                f"--directory={base}",
                "--volatile=overlay",  # the image stays as it is; what apt adds is a tmpfs
                "--console=pipe",
                f"--bind={shared_dir()}:{GUEST_CACHE}",
                f"--bind={apt}:/var/cache/apt/archives",  # kept: .debs fetched once
                f"--bind={tree}:{lay.llama_dir}",
                f"--bind-ro={BUILD_SCRIPT}:/run/servefleet-build.sh",
                *[f"--setenv={k}={v}" for k, v in env.items()],
                f"--setenv=CCACHE_STATSLOG={STATS_LOG}",
                "/bin/sh",
                "-c",
                INSTALL.format(packages=" ".join(want["packages"])),
            ],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        seconds = round(time.monotonic() - started, 1)
        shutil.rmtree(tree, ignore_errors=True)
        if out.returncode != 0:
            raise RuntimeError(
                f"llama.cpp {want['tag']} with {release}'s toolchain failed (exit "
                f"{out.returncode}): {(out.stderr or out.stdout).strip()[-2000:]}"
            )
        toolchain = [
            line.removeprefix("toolchain ")
            for line in out.stdout.splitlines()
            if line.startswith("toolchain ")
        ]
        stats = out.stdout.partition("== ccache")[2]
        cache: dict[str, int] = {}
        for key, value in STAT.findall(stats):  # the first: calls (local storage's come next)
            cache.setdefault(key.lower(), int(value))
        stamp = {**want, "toolchain": toolchain, "ccache": cache, "build_seconds": seconds}
        (root / "stamp.json").write_text(json.dumps(stamp, indent=1) + "\n")
        log(f"llama.cpp {want['tag']} with {release}'s toolchain: {seconds:.0f} s, ccache {cache}")
        return stamp
