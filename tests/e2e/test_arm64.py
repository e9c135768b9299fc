"""The Spark recipe on an arm64 guest, every binary emulated by qemu-user (issue #29 part 3).

`spark-3@bookworm-arm64` comes up bare on a testbed of its own (or beside the session's hosts
where one worker runs every module), and deploys/serve_bf16.py converges it with the Spark's data
as it ships: `expected_arch = "aarch64"` from group_data/spark.py (the testbed gives an emulated
guest no architecture of its own: servefleet_dev.testbed.inventory), so the preflight checks the
architecture the node reports; PyPI's real aarch64 wheels of torch 2.11.0+cu130 and vLLM 0.24.0
for the Python the guest reports; the real patch of that venv's qwen3_5.py, pristine hash checked;
the engine stand-in behind the real unit, health-gated. Then a second converge changes nothing
and `servefleet drift` is in sync.

Debian 12, not 13: Debian 13 arm64 boots here but its systemd sets up no mount namespace under
qemu-user, and both serving units have ProtectSystem=strict (docs/evidence.md, Platforms:
probes). What emulation changes: everything runs 2-12x slower, and the guest's systemd skips the
seccomp settings and enforces no DevicePolicy= or IPAddressDeny= (no bpf() under qemu-user): the
last test shows it, so this guest proves the install path, the patch and idempotence, not the
sandbox. What it cannot show: CUDA on the GB10 (sm_121), its unified memory, DGX OS's packages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from servefleet.engines.vllm.operations.patch import recorded_patch
from servefleet_dev.testbed import guest, hosts as tb_hosts, lifecycle, material, platforms
from servefleet_dev.testbed.inventory import host_data
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, timed
from tests.conftest import hosts_of_their_own

pytestmark = pytest.mark.e2e

INVENTORY, BF16 = "inventory/testbed.py", "deploys/serve_bf16.py"
SPEC = "spark-3@bookworm-arm64"
HOST = platforms.parse(SPEC).name
UNIT = "servefleet-vllm.service"
ROOT = "/opt/servefleet"
VENV = f"{ROOT}/venvs/vllm-0.24.0"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]


def ssh(command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    rec = load_state().hosts[HOST]
    return subprocess.run(
        [*tb_hosts.ssh_args(rec), command], capture_output=True, text=True, timeout=timeout
    )


def converge(**data):
    return timed("arm64", INVENTORY, BF16, HOST, data)


@pytest.fixture(scope="module")
def arm64():
    """The bare arm64 host: {"refused": a converge told the wrong architecture, "first": the
    converge with the Spark's own data}."""
    with hosts_of_their_own([SPEC], log=lambda m: print(f"[arm64] {m}")):
        started = time.monotonic()
        material.prepare(rtx4090=False)  # the aarch64 torch (the guest's Python) and vLLM wheels
        print(f"[arm64] material in {time.monotonic() - started:.0f} s")
        refused = converge(expected_arch="x86_64")
        bare = ssh(f"test -e {ROOT} && echo present || echo absent").stdout.strip()
        yield {"refused": refused, "bare_after_refusal": bare, "first": converge()}


def test_the_host_is_an_emulated_arm64_guest_with_the_sparks_own_architecture(arm64):
    row = {r["name"]: r for r in lifecycle.status()}[HOST]
    assert (row["release"], row["arch"]) == ("bookworm", "arm64"), row
    assert ssh("uname -m").stdout.strip() == "aarch64"
    # Nothing of the testbed's overrides it: the class's value is the one the preflight checks.
    rec = load_state().hosts[HOST]
    assert "expected_arch" not in host_data(rec, None)
    assert material.SPARK["expected_arch"] == "aarch64"
    # Told another architecture, the preflight refuses the node, in one line, before any change.
    refused = arm64["refused"]
    assert refused.returncode != 0 and refused.changed == 0, refused.output[-3000:]
    assert "CPU architecture is aarch64, the recipe is built for x86_64" in refused.output
    assert "Traceback" not in refused.output
    assert arm64["bare_after_refusal"] == "absent"


def test_the_recipe_installs_the_real_aarch64_wheels_patches_and_serves(arm64):
    run = arm64["first"]
    assert run.returncode == 0 and run.errors == 0, run.output[-5000:]
    rec = load_state().hosts[HOST]
    python = guest.python_version(rec)  # asked: the node's /usr/bin/python3
    site = guest.site_packages(rec, VENV)
    out = ssh(
        f"{VENV}/bin/python -c 'import sys, importlib.metadata as m; "
        f'print("%d.%d" % sys.version_info[:2], m.version("torch"), m.version("vllm"))\'; '
        f"grep -h '^Tag:' {site}/torch-2.11.0.dist-info/WHEEL {site}/vllm-0.24.0.dist-info/WHEEL"
    )
    lines = out.stdout.splitlines()
    assert lines[0].split() == [python, "2.11.0", "0.24.0"], out.stderr
    assert [t.rsplit("_", 1)[-1] for t in lines[1:]] == ["aarch64", "aarch64"], lines  # PyPI's
    # The native code is aarch64: the ELF header of torch's CPU library (e_machine 183).
    elf = ssh(f"od -An -j18 -N2 -tu2 {site}/torch/lib/libtorch_cpu.so").stdout.split()
    assert elf == ["183"], elf
    qwen = f"{site}/vllm/model_executor/models/qwen3_5.py"
    sums = ssh(f"sha256sum {qwen} {qwen}.orig").stdout.split()[::2]
    patch = recorded_patch("0.24.0")
    assert sums == [patch.patched_sha256, patch.pristine_sha256]
    assert ssh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    assert ssh("systemctl is-system-running").stdout.strip() == "running"


def test_a_second_converge_changes_nothing_and_drift_is_in_sync(arm64):
    again = converge()
    assert again.returncode == 0, again.output[-4000:]
    assert again.changed == 0 and again.no_change == again.operations > 0, again.output[-4000:]
    print(f"[arm64] first converge {arm64['first'].seconds:.0f} s, second {again.seconds:.0f} s")
    drift = subprocess.run(
        [*CLI, "drift", INVENTORY, BF16, "--limit", HOST, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert drift.returncode == 0, drift.stdout[-3000:] + drift.stderr[-3000:]
    states = {i["state"] for i in json.loads(drift.stdout)["hosts"][HOST]["items"]}
    assert "drifted" not in states and "in_sync" in states, drift.stdout[-3000:]


def test_what_the_emulated_guest_cannot_enforce(arm64):
    """The limit of this tier, shown rather than assumed: the guest's systemd runs a unit that
    forbids uname(2) and every device, and the command runs anyway (seccomp and cgroup BPF are
    unavailable under qemu-user). On a native guest the same unit is killed (test_security)."""
    out = ssh(
        "systemd-run --wait --pipe --collect -q -p SystemCallFilter=~uname "
        "-p DevicePolicy=closed -- sh -c 'uname -m; : < /dev/net/tun && echo opened'"
    )
    assert out.stdout.split() == ["aarch64", "opened"], out.stdout + out.stderr
