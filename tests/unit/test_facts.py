"""Fact parsers against real output: nvidia-smi captured on the lent H200 (driver 580)."""

import json
from pathlib import Path

from servefleet.core.node import (
    node_problems,
    parse_meminfo,
    parse_nvidia_smi,
    parse_os_release,
    usable_memory,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_nvidia_smi_of_a_real_h200_parses():
    lines = (FIXTURES / "h200/nvidia-smi-query.csv").read_text().splitlines()
    (gpu,) = parse_nvidia_smi(lines)
    assert gpu.name == "NVIDIA H200"
    assert gpu.driver_version.startswith("580.")
    assert gpu.driver_major == 580
    assert gpu.compute_capability == "9.0"
    # 143771 MiB as nvidia-smi's table shows it on that machine
    table = (FIXTURES / "h200/nvidia-smi.txt").read_text()
    mib = gpu.memory_bytes // 1024**2
    assert f"{mib}MiB" in table


def test_facts_read_on_the_gpu_host_match_the_parsers():
    # facts.json was written by tests/device/facts_probe.py through pyinfra @local on the H200.
    found = json.loads((FIXTURES / "h200/facts.json").read_text())
    lines = (FIXTURES / "h200/nvidia-smi-query.csv").read_text().splitlines()
    assert found["gpus"][0]["memory_bytes"] == parse_nvidia_smi(lines)[0].memory_bytes
    assert found["arch"] == "x86_64" and found["os"]["family"] == "ubuntu"


def test_unified_memory_gpu_reports_no_memory_and_system_memory_is_used():
    # GB10 (DGX Spark) reports memory.total as [N/A]: unified memory.
    (gpu,) = parse_nvidia_smi(["0, NVIDIA GB10, [N/A], 580.95.05, 12.1"])
    assert gpu.memory_bytes is None and gpu.compute_capability == "12.1"
    memory = {"total": 128 * 1024**3, "available": 120 * 1024**3}
    assert usable_memory({}, memory, [gpu]) == 128 * 1024**3
    assert usable_memory({"usable_memory_bytes": 114 * 1024**3}, memory, [gpu]) == 114 * 1024**3


def test_meminfo_and_os_release():
    mem = parse_meminfo(
        ["MemTotal:       24576000 kB", "MemFree: 100 kB", "MemAvailable:   20000000 kB"]
    )
    assert mem == {"total": 24576000 * 1024, "available": 20000000 * 1024}
    info = parse_os_release(['PRETTY_NAME="Ubuntu 24.04.3 LTS"', "ID=ubuntu", 'VERSION_ID="24.04"'])
    assert info["family"] == "ubuntu" and info["version_id"] == "24.04"


def _data(**kw):
    base = {
        "require_gpu": True,
        "min_driver_version": 580,
        "expected_arch": "aarch64",
        "min_free_disk_bytes": 10,
        "servefleet_root": "/opt/servefleet",
    }
    return {**base, **kw}


def test_preflight_names_each_problem():
    old = parse_nvidia_smi(["0, NVIDIA GeForce RTX 4090, 24564, 550.54.14, 8.9"])
    problems = node_problems(arch="x86_64", gpus=old, free_disk=1, data=_data())
    text = " | ".join(problems)
    assert "x86_64" in text and "aarch64" in text
    assert "550.54.14" in text and "580" in text
    assert "need" in text
    assert node_problems(
        arch="x86_64", gpus=[], free_disk=1, data=_data(expected_arch=None, min_free_disk_bytes=0)
    )[0].startswith("no NVIDIA GPU")


def test_preflight_without_gpu_requirement_passes_a_cpu_host():
    assert (
        node_problems(
            arch="x86_64", gpus=[], free_disk=100, data=_data(require_gpu=False, expected_arch=None)
        )
        == []
    )
