"""Both recipes on Debian 13 (trixie) guests, beside the session's Debian 12 hosts (issue #29).

`spark-2@trixie` and `rtx4090-2@trixie` come up bare next to the session's hosts, and
deploys/serve_bf16.py (the real torch 2.11.0 and vLLM 0.24.0 wheels for the Python the guest
reports, the real patch, the engine stand-in) and deploys/serve_q4_llamacpp.py (llama.cpp b9785
built from the testbed mirror, its compiles out of the ccache that Debian 13's own toolchain
filled: servefleet_dev/testbed/toolchain.py) converge them side by side. Then: a second converge
changes nothing, `servefleet drift` is in sync, the product's sandbox probe passes under the
guest's own systemd, and `systemd-analyze security` there gives the exposure figure of the
version that systemd reports (benchmarks/exposure.py, one capture per version in
tests/fixtures/systemd/).

What differs between the releases is read from each node, never named here: the Python (3.11
on Debian 12, 3.13 on Debian 13), systemd's version and its system-call groups, and how systemd
keeps a failed transient unit and refuses a W+X mapping; the last two are tried on a Debian 12
host of the session too.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servefleet.core import sandbox
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet.engines.vllm.operations.patch import recorded_patch
from servefleet_dev.testbed import guest, hosts as tb_hosts, lifecycle, material, platforms
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, timed
from servefleet_dev.testing.sandbox_model import syscall_groups

pytestmark = pytest.mark.e2e

INVENTORY = "inventory/testbed.py"
BF16, Q4 = "deploys/serve_bf16.py", "deploys/serve_q4_llamacpp.py"
SPARK, LLAMA = "spark-2@trixie", "rtx4090-2@trixie"
RECIPES = {platforms.parse(SPARK).name: BF16, platforms.parse(LLAMA).name: Q4}
UNITS = {BF16: "servefleet-vllm.service", Q4: "servefleet-llama.service"}
ROOT = "/opt/servefleet"
VENV = f"{ROOT}/venvs/vllm-0.24.0"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
CAPTURES = REPO_ROOT / "tests" / "fixtures" / "systemd"
SESSION_DEBIAN_12 = "rtx4090-1"  # the session's own host, for what differs by systemd version


def ssh(name: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    rec = load_state().hosts[name]
    return subprocess.run(
        [*tb_hosts.ssh_args(rec), command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def converge(host: str):
    return timed("debian13", INVENTORY, RECIPES[host], host)


@pytest.fixture(scope="module")
def trixie(testbed):
    """Both Debian 13 hosts, bare, then converged side by side: {host: its first run}."""
    quiet = lambda m: None  # noqa: E731
    names = list(RECIPES)
    try:
        started = time.monotonic()
        for spec in (SPARK, LLAMA):
            lifecycle.add(spec, log=quiet)
        print(f"[debian13] hosts up in {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        material.prepare()  # the guest's Python's torch wheel; Debian 13's compiles in ccache
        print(f"[debian13] material in {time.monotonic() - started:.0f} s")
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            first = dict(zip(names, pool.map(converge, names), strict=True))
        yield first
    finally:
        for name in names:
            if name in load_state().hosts:
                lifecycle.rm(name, log=quiet)


def node_facts(name: str) -> dict[str, str]:
    """What the node says it is: os-release's codename, systemd's and Python's versions."""
    out = ssh(
        name,
        ". /etc/os-release; echo $VERSION_CODENAME; systemctl --version | head -n 1; "
        "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'",
    )
    codename, systemd, python = out.stdout.splitlines()
    return {"codename": codename, "systemd": systemd.split()[1], "python": python}


def test_the_hosts_are_debian_13_guests(trixie):
    rows = {r["name"]: r for r in lifecycle.status()}
    for name in RECIPES:
        assert (rows[name]["release"], rows[name]["arch"]) == ("trixie", "amd64"), rows[name]
        facts = node_facts(name)
        print(f"[debian13] {name}: {facts}")
        assert facts["codename"] == "trixie"
    # Another release than the session's own hosts: its systemd and Python are others.
    assert node_facts(SESSION_DEBIAN_12)["codename"] != "trixie"


@pytest.mark.parametrize("host", list(RECIPES))
def test_each_recipe_converges_the_bare_host_and_serves(trixie, host):
    run, unit = trixie[host], UNITS[RECIPES[host]]
    assert run.returncode == 0 and run.errors == 0, run.output[-5000:]
    # The unit's sandbox was tried by the guest's own systemd before the first start.
    probe = f"Sandbox probe of {unit} (before the restart)"
    assert re.search(rf"{re.escape(probe)}\s+1\s+1\s+-\s+-", run.output), run.output[-5000:]
    assert ssh(host, f"systemctl is-active {unit}").stdout.strip() == "active"
    assert ssh(host, "systemctl is-system-running").stdout.strip() == "running"


def test_the_vllm_venv_is_the_nodes_python_with_the_real_patched_wheels(trixie):
    host = platforms.parse(SPARK).name
    rec = load_state().hosts[host]
    python = guest.python_version(rec)  # asked: the node's /usr/bin/python3
    versions = ssh(
        host,
        f"{VENV}/bin/python -c 'import sys, importlib.metadata as m; "
        f'print("%d.%d" % sys.version_info[:2], m.version("torch"), m.version("vllm"))\'',
    )
    assert versions.stdout.split() == [python, "2.11.0", "0.24.0"], versions.stderr
    qwen = f"{guest.site_packages(rec, VENV)}/vllm/model_executor/models/qwen3_5.py"
    sums = ssh(host, f"sha256sum {qwen} {qwen}.orig").stdout.split()[::2]
    patch = recorded_patch("0.24.0")
    assert sums == [patch.patched_sha256, patch.pristine_sha256]


def test_llama_server_is_built_at_the_pin_from_the_mirror(trixie):
    host = platforms.parse(LLAMA).name
    current = ssh(host, f"readlink -f {ROOT}/llama.cpp/current").stdout.strip()
    assert current.endswith("/" + llamacpp.build_name(material.RTX4090))
    record = json.loads(ssh(host, f"cat {current}/build.json").stdout)
    assert record["commit"] == material.RTX4090["llamacpp_commit"]
    print(f"[debian13] llama.cpp build on {host}: {record['build_seconds']} s")


@pytest.mark.parametrize("host", list(RECIPES))
def test_a_second_converge_changes_nothing_and_drift_is_in_sync(trixie, host):
    again = converge(host)
    assert again.returncode == 0, again.output[-4000:]
    assert again.changed == 0 and again.no_change == again.operations > 0, again.output[-4000:]
    drift = subprocess.run(
        [*CLI, "drift", INVENTORY, RECIPES[host], "--limit", host, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert drift.returncode == 0, drift.stdout[-3000:] + drift.stderr[-3000:]
    report = json.loads(drift.stdout)
    states = {i["state"] for i in report["hosts"][host]["items"]}
    assert "drifted" not in states and "in_sync" in states, report["hosts"][host]


def probe(host: str, props, argv: list[str]) -> subprocess.CompletedProcess:
    """The product's sandbox probe (servefleet.core.sandbox) of a transient unit, as `daemon`
    (every Debian has the account and its group; the session's own host may not be converged
    yet, so it may have no servefleet account)."""
    script = sandbox.probe_script("sf-release-check.service", "daemon", props, [], argv, False)
    return ssh(host, f"sh -c {shlex.quote(script)}")


@pytest.mark.parametrize("host", list(RECIPES))
def test_the_probe_passes_under_each_units_own_sandbox(trixie, host):
    """A rollback's probe: the unit on disk read back (user, sandbox, environment), its
    executable's --version under exactly that sandbox, by the node's own systemd."""
    unit = UNITS[RECIPES[host]]
    text = ssh(host, f"cat /etc/systemd/system/{unit}").stdout
    user, props, env, gpu = sandbox.unit_sandbox(text)
    script = sandbox.probe_script(unit, user, props, env, sandbox.version_argv(text), gpu)
    out = ssh(host, f"sh -c {shlex.quote(script)}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert ssh(host, "systemctl list-units --failed --no-legend --plain").stdout.strip() == ""


@pytest.mark.parametrize("host", [SESSION_DEBIAN_12, platforms.parse(LLAMA).name])
def test_a_refused_probe_leaves_no_failed_unit_and_wx_memory_is_refused(trixie, host):
    """Two things the releases' systemd do differently, on one host of each. systemd 257 keeps
    a failed transient unit until it is reset (252 collects it): the probe passes --collect,
    so a refused probe leaves the node `running`, not `degraded`. MemoryDenyWriteExecute=
    refuses a W+X mapping with EPERM on 252 (seccomp) and EACCES on 257 (the kernel's
    PR_SET_MDWE first): refused either way, whichever the node's systemd says."""
    version = node_facts(host)["systemd"]
    shipped = sandbox.properties(["/tmp"], gpu=False, memory_deny_write_execute=True)
    killed = probe(host, [*shipped, ("SystemCallFilter", "~uname")], ["/usr/bin/uname", "-m"])
    assert killed.returncode == 1, killed.stdout + killed.stderr
    assert "a system call outside SystemCallFilter=" in killed.stderr, killed.stderr
    # Gone, not kept failed (the session's host may be `degraded` by an earlier test's crash).
    assert "sf-release-check" not in ssh(host, "systemctl list-units --all --plain").stdout
    if host in RECIPES:
        assert ssh(host, "systemctl is-system-running").stdout.strip() == "running"
    wx = (
        "import mmap, errno\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    print('mapped')\n"
        "except PermissionError as exc:\n"
        "    print('refused', errno.errorcode[exc.errno])\n"
    )
    out = probe(host, shipped, ["/usr/bin/python3", "-c", wx])
    assert out.returncode == 0 and "refused" in out.stdout, out.stdout + out.stderr
    print(f"[debian13] {host} (systemd {version}): W+X {out.stdout.split()[-1]}")
    unguarded = [p for p in shipped if p[0] != "MemoryDenyWriteExecute"]
    plain = probe(host, unguarded, ["/usr/bin/python3", "-c", wx])
    assert "mapped" in plain.stdout, plain.stdout + plain.stderr  # the setting refused it


def capture(kind: str, version: str) -> Path:
    path = CAPTURES / f"{kind}-{version}.txt"
    assert path.exists(), f"no {kind} capture for systemd {version}, the node's: {path}"
    return path


@pytest.mark.parametrize("host", list(RECIPES))
def test_exposure_and_syscall_groups_are_those_of_the_nodes_systemd(trixie, host):
    """systemd-analyze on the node: the running unit scores as well as the capture for the
    version the node reports (benchmarks/exposure.py --node), and the node's system-call
    groups are that version's capture (the sandbox model's input)."""
    unit = UNITS[RECIPES[host]]
    version = node_facts(host)["systemd"]
    out = ssh(host, f"systemd-analyze security {unit} --no-pager").stdout
    running = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    bench = subprocess.run(
        [sys.executable, "benchmarks/exposure.py", "--node", host],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert bench.stdout.startswith(f"systemd {version} "), bench.stdout
    rows = lambda text: [ln.split() for ln in text.splitlines() if ln.startswith("servefleet-")]  # noqa: E731
    assert rows(bench.stdout) == rows(capture("exposure", version).read_text()), bench.stdout
    offline = {(row[0], row[1]): float(row[2]) for row in rows(bench.stdout)}
    print(f"[debian13] {unit} on {host}, systemd {version}: running {running}, {offline}")
    assert running <= offline[(unit, "False")] <= 2.5
    groups = ssh(host, "systemd-analyze syscall-filter --no-pager").stdout
    assert syscall_groups(groups) == syscall_groups(capture("syscall-filter", version).read_text())
