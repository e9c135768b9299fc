"""What differs between the Debian releases the testbed runs, on captures read from a guest of
each (tests/fixtures/os-release/, tests/fixtures/systemd/), and the compile of the llama.cpp pin
with another release's toolchain (servefleet_dev/testbed/toolchain.py).

Nothing here names a release's Python or systemd version: each capture says which it is.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from servefleet.core import sandbox
from servefleet.core.node import parse_os_release, per_family
from servefleet_dev.testbed import toolchain
from servefleet_dev.testbed.hosts import GUEST_CACHE
from servefleet_dev.testbed.material import load as group_data
from servefleet_dev.testing.sandbox_model import expand, syscall_groups

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
OS_RELEASES = sorted((FIXTURES / "os-release").glob("debian-*.txt"))
SYSTEMD = FIXTURES / "systemd"


def _exposure_module():
    spec = importlib.util.spec_from_file_location("exposure", ROOT / "benchmarks" / "exposure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXPOSURE = _exposure_module()


def versions(kind: str) -> set[str]:
    return {p.stem.removeprefix(f"{kind}-") for p in SYSTEMD.glob(f"{kind}-*.txt")}


def test_both_releases_os_release_read_as_the_debian_family_with_the_same_packages():
    """Data stays keyed by OS family: Debian 13's os-release adds a field (DEBIAN_VERSION_FULL)
    and names another release, and both are `debian`, whose package names hold on both."""
    assert len(OS_RELEASES) >= 2
    infos = [parse_os_release(p.read_text().splitlines()) for p in OS_RELEASES]
    assert {i["family"] for i in infos} == {"debian"}
    assert len({i["version_codename"] for i in infos}) == len(infos)
    for info, path in zip(infos, OS_RELEASES, strict=True):
        assert path.stem == f"debian-{info['version_id']}"
    data = group_data("all", "rtx4090", "llamacpp")
    for key in ("os_packages", "llamacpp_build_packages", "python_interpreter"):
        picked = {str(per_family(data, key, i["family"], "h")) for i in infos}
        assert len(picked) == 1, key


def test_each_systemd_version_has_its_syscall_groups_and_its_exposure_capture():
    """One capture of each per systemd version, each naming the version it was read from."""
    assert versions("syscall-filter") == versions("exposure") and len(versions("exposure")) >= 2
    for version in versions("exposure"):
        text = (SYSTEMD / f"exposure-{version}.txt").read_text()
        assert EXPOSURE.version_of(text) == version
        rows = [ln.split() for ln in text.splitlines() if ln.startswith("servefleet-")]
        assert {(r[0], r[1]) for r in rows} == {
            (u, g)
            for u in ("servefleet-vllm.service", "servefleet-llama.service")
            for g in ("True", "False")
        }
        assert all(float(r[2]) <= 2.5 and r[3] == "OK" for r in rows), rows
        header = (SYSTEMD / f"syscall-filter-{version}.txt").read_text().splitlines()[0]
        assert f"systemd {version} (" in header


def test_a_later_systemds_system_service_group_only_adds_calls():
    """The units' allow list (@system-service) grows with systemd (257 adds landlock, mseal,
    seccomp, ...); nothing a unit relied on is dropped."""
    by_version = {
        v: expand(
            "@system-service", syscall_groups((SYSTEMD / f"syscall-filter-{v}.txt").read_text())
        )
        for v in versions("syscall-filter")
    }
    ordered = [by_version[v] for v in sorted(by_version, key=int)]
    for older, newer in zip(ordered, ordered[1:], strict=False):
        assert older <= newer


def test_exposure_script_scores_every_unit_and_reads_the_version_line(tmp_path):
    script = EXPOSURE.script("systemd-analyze", {"cpu/a.service": "[Service]\n"})
    assert script.splitlines()[3] == "systemd-analyze --version"
    assert "'== cpu/a.service'" in script and "--offline=yes" in script
    assert EXPOSURE.version_of("systemd 257 (257.13-1~deb13u1)\n+PAM") == "257"
    with pytest.raises(ValueError):
        EXPOSURE.version_of("not systemd")


def test_the_machines_release_is_read_from_its_os_release(tmp_path):
    for path in OS_RELEASES:
        info = parse_os_release(path.read_text().splitlines())
        assert toolchain.machine_release(path) == info["version_codename"]
    ubuntu = tmp_path / "os-release"
    ubuntu.write_text('ID=ubuntu\nVERSION_CODENAME=noble\nVERSION_ID="24.04"\n')
    assert toolchain.machine_release(ubuntu) is None  # Ubuntu's gcc is no Debian guest's


def test_the_toolchain_build_runs_build_sh_as_a_testbed_node_does():
    """The container's build environment is the recipe's on a testbed rtx4090 node: the node's
    tree, the mirror and ccache at the guests' paths, the testbed's flags, jobs and launcher."""
    data = group_data(*toolchain.GROUPS)
    env = toolchain.guest_env(data)
    assert env["SRC_DIR"] == "/opt/servefleet/llama.cpp/src"
    assert env["BUILD_DIR"] == "/opt/servefleet/llama.cpp/build"
    assert env["GIT_URL"] == data["llamacpp_git_url"] and env["GIT_URL"].startswith(GUEST_CACHE)
    assert env["CCACHE_DIR"] == data["llamacpp_ccache_dir"]
    assert env["CCACHE_DIR"].startswith(GUEST_CACHE + "/")
    assert env["COMMIT"] == data["llamacpp_commit"] and env["JOBS"] == "2"
    assert "-DGGML_CUDA=OFF" in env["CMAKE_ARGS"].split()
    assert env["LAUNCHER_ARGS"].split() == [
        "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
        "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
    ]
    # apt as servefleet.operations.node.os_packages runs it, the build packages of the family.
    assert "--no-install-recommends" in toolchain.INSTALL
    assert data["llamacpp_build_packages"][toolchain.FAMILY] == [
        "build-essential",
        "cmake",
        "git",
        "ccache",
    ]


def test_the_toolchain_builds_stamp_names_what_it_was_made_from(tmp_path):
    data = group_data(*toolchain.GROUPS)
    want = toolchain.identity("trixie", tmp_path / "base-trixie-amd64-0123456789abcdef", data)
    assert want["image"] == "base-trixie-amd64-0123456789abcdef"
    assert (want["tag"], want["commit"]) == (data["llamacpp_tag"], data["llamacpp_commit"])
    assert want["cmake_flags"] == data["llamacpp_cmake_flags"]
    stats = "Cacheable calls: 90 / 90 (100.0%)\n  Hits: 88 / 90\n  Misses: 2 / 90\nLocal storage:\n  Hits: 5\n"
    assert toolchain.STAT.findall(stats) == [
        ("Hits", "88"),
        ("Misses", "2"),
        ("Hits", "5"),
    ]
    assert re.search(r"apt-get install .*\{packages\}", toolchain.INSTALL)


def run_captures() -> dict[str, dict[str, str]]:
    """{capture: {case: systemd-run's output}} of tests/fixtures/systemd/systemd-run-*.txt."""
    found = {}
    for path in sorted(SYSTEMD.glob("systemd-run-*.txt")):
        cases, name = {}, None
        for line in path.read_text().splitlines():
            if line.startswith("== "):
                name = line[3:]
                cases[name] = ""
            elif name and not line.startswith("#"):
                cases[name] += line + "\n"
        found[path.stem] = cases
    return found


RUNS = run_captures()


@pytest.mark.parametrize("capture", sorted(RUNS))
def test_a_failed_probe_says_the_same_on_each_systemd_version(capture):
    """systemd-run's verdict reads `code=killed/status=SYS` on one version and `code=killed,
    status=31/SYS` on a later one, which names every status: the probe's one line names the
    cause on each (servefleet.core.sandbox EXPLAIN_AWK), from real output of both."""

    def said(case: str) -> str:
        out = subprocess.run(
            ["sh", "-c", f"awk {sandbox.EXPLAIN_AWK}"],
            input=RUNS[capture][case],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    assert said("sys").endswith("SYS (a system call outside SystemCallFilter=)")
    assert said("user").endswith("status=217/USER")
    assert said("namespace").endswith(
        "status=226/NAMESPACE (a ReadWritePaths= or other mount of the sandbox failed)"
    )
    denied = said("denied")
    assert denied.startswith("Permission denied; code=exited") and "status=3" in denied
    for case in RUNS[capture]:  # systemd-run's own lines never count as the probe's
        assert not said(case).startswith(("Running as unit", "Service runtime", "CPU time"))
