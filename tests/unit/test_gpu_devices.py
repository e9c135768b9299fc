"""Both GPU units reach exactly the CUDA device nodes, on captured device tables.

systemd's device access control is modelled in servefleet_dev.testing.sandbox_model (the same
model decides which nodes the H200's emulated sandbox gets). The tables are the device
table of a real H200 (driver 580, open kernel module, captured on the lent machine) and a
proprietary-module table from before driver 550.40 (tests/fixtures/devices/).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from servefleet.core import sandbox
from servefleet.core.systemd import render_unit
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet.engines.vllm import logic as vllm
from servefleet_dev.testbed.material import load as group_data
from servefleet_dev.testing.sandbox_model import (
    CUDA_NODE,
    DeviceTable,
    allowed,
    problems,
    reachable,
    syscall_allow_list,
    syscall_groups,
)

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "tests" / "fixtures" / "devices"
H200 = TABLES / "h200-open-580.txt"
PROPRIETARY = TABLES / "proprietary-pre550.txt"


def gpu_units() -> dict[str, str]:
    """Both units rendered from the shipped group data of their role, require_gpu = True."""
    spark = group_data("all", "spark", "vllm")
    rtx = group_data("all", "rtx4090", "llamacpp")
    assert spark["require_gpu"] is True and rtx["require_gpu"] is True
    model = "/opt/servefleet/models/org--name/" + "0" * 40
    return {
        "vllm": render_unit(
            "files/vllm/servefleet-vllm.service.j2", vllm.unit_context(spark, model)
        ),
        "llama.cpp": render_unit(
            "files/llamacpp/servefleet-llama.service.j2",
            llamacpp.unit_context(rtx, model, lambda: None),
        ),
    }


@pytest.fixture
def rendered(monkeypatch):
    monkeypatch.chdir(ROOT)  # templates and their includes resolve against the project
    return gpu_units()


def test_the_tables_parse():
    h200, old = DeviceTable.read(H200), DeviceTable.read(PROPRIETARY)
    assert h200.nodes["/dev/nvidia0"] == (195, 0) and h200.nodes["/dev/nvidiactl"] == (195, 255)
    assert h200.nodes["/dev/nvidia-caps/nvidia-cap2"] == (241, 2)
    assert h200.majors("nvidia") == {195} and h200.majors("nvidia-frontend") == set()
    assert old.majors("nvidia-frontend") == {195} and old.majors("nvidia") == set()
    assert len([p for p in h200.nodes if CUDA_NODE.fullmatch(p)]) == 6


@pytest.mark.parametrize("table", [H200, PROPRIETARY], ids=["h200-open-580", "proprietary"])
@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_gpu_units_reach_exactly_the_cuda_nodes(rendered, engine, table):
    devices = DeviceTable.read(table)
    assert problems(rendered[engine], devices) == []
    reach = reachable(rendered[engine], devices)
    assert all(reach[p] for p in devices.nodes if CUDA_NODE.fullmatch(p))
    # and nothing of the fabric (nvlink, nvswitch, IMEX channels), nor any other device group
    others = {m for m, n in devices.groups if not n.startswith("nvidia")}
    fabric = {
        m
        for m, n in devices.groups
        if n in ("nvidia-nvlink", "nvidia-nvswitch", "nvidia-caps-imex-channels")
    }
    majors, _ = allowed(rendered[engine], devices)
    assert not majors & (others | fabric)


def test_the_old_allow_list_misses_nvidia0_on_the_h200(rendered):
    """The negative case: the allow list shipped before (char-nvidia-frontend for the GPUs)."""
    old = re.sub(
        r"(DeviceAllow=.*\n)+",
        "DeviceAllow=char-nvidia-frontend rw\n"
        "DeviceAllow=char-nvidia-uvm rw\nDeviceAllow=char-nvidia-caps rw\n"
        "DeviceAllow=/dev/nvidiactl rw\nDeviceAllow=/dev/nvidia-uvm rw\n"
        "DeviceAllow=/dev/nvidia-uvm-tools rw\n",
        rendered["vllm"],
        count=1,
    )
    assert old != rendered["vllm"]
    assert problems(old, DeviceTable.read(H200)) == ["/dev/nvidia0 (195, 0) is not allowed"]
    assert problems(old, DeviceTable.read(PROPRIETARY)) == []  # right only on the old driver
    only_frontend = "DevicePolicy=closed\nDeviceAllow=char-nvidia-frontend rw\n"
    assert "/dev/nvidia0 (195, 0) is not allowed" in problems(only_frontend, DeviceTable.read(H200))


def test_too_wide_an_allow_list_is_caught(rendered):
    wide = rendered["llama.cpp"].replace(
        "DeviceAllow=char-nvidia rw", "DeviceAllow=char-nvidia* rw"
    )
    found = problems(wide, DeviceTable.read(H200))
    assert any("nvidia-nvswitch" in p for p in found) and any("imex" in p for p in found)
    assert (
        problems(
            "DevicePolicy=closed\nDeviceAllow=char-nvidia rw\nDeviceAllow=/dev/ptp0 rw\n"
            "DeviceAllow=char-ptp rw\n",
            DeviceTable.read(H200),
        )
        != []
    )


def test_gpu_units_make_the_device_nodes_before_the_sandboxed_start(rendered):
    for engine, unit in rendered.items():
        lines = unit.splitlines()
        assert "ExecStartPre=+-/usr/bin/nvidia-modprobe -u -c=0" in lines, engine
        # before the sandboxed ExecStartPre / ExecStart that need the nodes
        first_exec = next(i for i, line in enumerate(lines) if line.startswith("ExecStart"))
        assert lines[first_exec] == "ExecStartPre=+-/usr/bin/nvidia-modprobe -u -c=0", engine


def test_testbed_units_allow_no_device(monkeypatch):
    monkeypatch.chdir(ROOT)
    spark = group_data("all", "spark", "vllm", "testbed_vllm", "testbed")
    unit = render_unit("files/vllm/servefleet-vllm.service.j2", vllm.unit_context(spark, "/m"))
    assert "DevicePolicy=closed" in unit.splitlines() and "DeviceAllow" not in unit
    assert "nvidia-modprobe" not in unit
    assert all(not ok for ok in reachable(unit, DeviceTable.read(H200)).values())


# One capture per systemd version, each read from a testbed guest of the release that ships it.
SYSCALLS = sorted((ROOT / "tests" / "fixtures" / "systemd").glob("syscall-filter-*.txt"))


@pytest.mark.parametrize("capture", SYSCALLS, ids=lambda p: p.stem)
def test_the_syscall_filter_model_expands_each_systemd_versions_groups(rendered, capture):
    groups = syscall_groups(capture.read_text())
    allow = syscall_allow_list(rendered["vllm"], groups)
    assert {"openat", "mmap", "clone3", "socket", "ioctl", "execve", "futex"} <= allow
    assert not {"mount", "reboot", "kexec_load", "init_module", "swapon", "ptrace"} & allow
    tightened = rendered["vllm"] + "SystemCallFilter=~@file-system\n"
    assert "openat" not in syscall_allow_list(tightened, groups)
    assert len(allow) > 300


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_the_probe_runs_under_exactly_the_units_sandbox(rendered, engine):
    """One list: the transient unit of the probe gets the unit's hardening lines, its user and
    environment; on a GPU node root first makes the device nodes, as ExecStartPre=+ does."""
    spark, rtx = group_data("all", "spark", "vllm"), group_data("all", "rtx4090", "llamacpp")
    model = "/opt/servefleet/models/org--name/" + "0" * 40
    if engine == "vllm":
        ctx, argv = vllm.unit_context(spark, model), vllm.probe_argv(spark)
        assert (
            argv[0] == "/opt/servefleet/venvs/vllm-0.24.0/bin/python"
            and "torch.cuda.init()" in argv[2]
        )
    else:
        ctx, argv = llamacpp.unit_context(rtx, model, lambda: None), llamacpp.probe_argv(rtx)
        assert argv == ["/bin/sh", "-c", llamacpp.NVIDIA_SMI_PROBE]
    script = sandbox.probe_script(
        f"servefleet-{'vllm' if engine == 'vllm' else 'llama'}.service",
        ctx["service_user"],
        ctx["sandbox"],
        ctx["environment"],
        argv,
        gpu=bool(ctx["gpu_setup"]),
    )
    assert script.startswith(
        "if [ -x /usr/bin/nvidia-modprobe ]; then /usr/bin/nvidia-modprobe -u -c=0"
    )
    run = script[script.index("systemd-run") : script.index(" 2>&1)")]
    words = shlex.split(run)
    props = [w.removeprefix("--property=") for w in words if w.startswith("--property=")]
    unit_lines = rendered[engine].splitlines()
    hardening = [f"{k}={v}" for k, v in ctx["sandbox"]]
    assert all(line in unit_lines for line in hardening)
    assert [p for p in props if p in hardening] == hardening  # all of them, in order
    assert "User=servefleet" in props and "Group=servefleet" in props
    env = [p for p in props if p.startswith("Environment=")]
    assert [f"Environment={e}" for e in ctx["environment"]] == env
    assert words[words.index("--") + 1 :] == argv


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_a_rollback_probes_the_recorded_unit_under_its_own_sandbox(rendered, engine):
    """A rollback has only the release's recorded unit file: read back, it gives the probe the
    very user, sandbox lines (DeviceAllow= included) and environment the converge's probe got."""
    spark, rtx = group_data("all", "spark", "vllm"), group_data("all", "rtx4090", "llamacpp")
    model = "/opt/servefleet/models/org--name/" + "0" * 40
    ctx = (
        vllm.unit_context(spark, model)
        if engine == "vllm"
        else llamacpp.unit_context(rtx, model, lambda: None)
    )
    user, props, env, gpu = sandbox.unit_sandbox(rendered[engine])
    assert (user, props, env, gpu) == (
        ctx["service_user"],
        ctx["sandbox"],
        ctx["environment"],
        True,
    )
    assert [v for k, v in props if k == "DeviceAllow"] == [
        f"char-{g} rw" for g in sandbox.NVIDIA_DEVICE_GROUPS
    ]
    # A release recorded before releases carried their probe: its program's --version.
    program = sandbox.version_argv(rendered[engine])
    assert program[1:] == ["--version"] and program[0].startswith("/")


def test_a_recorded_unit_without_a_sandbox_cannot_be_probed(rendered):
    stripped = "\n".join(
        line for line in rendered["llama.cpp"].splitlines() if not line.startswith("DevicePolicy=")
    )
    with pytest.raises(sandbox.UnitReadError, match="no sandbox"):
        sandbox.unit_sandbox(stripped)
    with pytest.raises(sandbox.UnitReadError, match="ExecStart"):
        sandbox.version_argv("[Service]\nUser=x\n")
