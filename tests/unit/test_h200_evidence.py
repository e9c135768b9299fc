"""The H200 evidence of the GPU path under the emulated sandbox (tests/fixtures/h200/sandbox/,
made by tests/device/gpu_sandbox.sh, on that machine before it had systemd) is evidence of the
code as it stands: the vLLM unit that served there is exactly what servefleet renders today for a
GPU node, and the recordings say what the closing notes claim (served under the sandbox, MDWE on,
the negative cases refused). The llama.cpp unit's evidence is real systemd's since: a converged
GPU node (tests/unit/test_h200_node.py, tests/fixtures/h200/node/)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from servefleet.core.systemd import render_unit
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet.engines.vllm import logic as vllm
from servefleet_dev.testing.h200_since import as_run_on_the_h200
from servefleet_dev.testing.sandbox_model import DeviceTable, problems

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "tests" / "fixtures" / "h200" / "sandbox"
H200_TABLE = ROOT / "tests" / "fixtures" / "devices" / "h200-open-580.txt"


def device_script():
    spec = importlib.util.spec_from_file_location(
        "gpu_sandbox", ROOT / "tests/device/gpu_sandbox.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rendered(monkeypatch):
    monkeypatch.chdir(ROOT)
    g = device_script()
    spark = g.data(
        "spark",
        max_model_len=4096,
        kv_cache_memory_bytes=2 * 1024**3,
        served_model_name="tiny",
        vllm_extra_args=["--gdn-prefill-backend", "triton"],
    )
    return {
        "servefleet-vllm.service": render_unit(
            "files/vllm/servefleet-vllm.service.j2",
            vllm.unit_context(
                spark, f"/opt/servefleet/models/servefleet-tests--tiny-qwen35moe/{g.SHA}"
            ),
        ),
    }


@pytest.mark.parametrize("name", ["servefleet-vllm.service"])
def test_the_units_that_served_on_the_h200_are_todays(rendered, name):
    assert (EVIDENCE / name).read_text() == as_run_on_the_h200(rendered[name]), (
        f"{name} changed since the H200 run: run tests/device/gpu_sandbox.sh again"
    )
    assert problems(rendered[name], DeviceTable.read(H200_TABLE)) == []


def test_vllm_served_a_chat_under_the_sandbox_with_mdwe():
    result = json.loads((EVIDENCE / "vllm-server.json").read_text())
    assert result["health_s"] and result["chat"]["choices"][0]["message"]["role"] == "assistant"
    # MDWE as the unit says (2026-12-03) or forced on (the rerun of 2026-12-06): the unit says
    # yes (below), and the sandbox reports it applied.
    assert result["args"][:2] in (["--mdwe", "unit"], ["--mdwe", "on"])
    started = [ln for ln in result["sandbox_lines"] if "system calls allowed" in ln]
    assert started and "as servefleet, mdwe True" in started[0]
    log = (EVIDENCE / "vllm-server.log").read_text()
    assert "GPU KV cache size: 2,957,684 tokens" in log  # = plan-kv for 4096 / 2 GiB
    assert "/dev/nvidia0" in next(ln for ln in log.splitlines() if "/dev holds" in ln)
    unit = (EVIDENCE / "servefleet-vllm.service").read_text()
    assert "MemoryDenyWriteExecute=yes" in unit.splitlines()


def test_the_vllm_engine_in_its_sandbox_could_not_read_the_token_or_the_records():
    """#27 rule 1 for vLLM on the GPU (rerun of 2026-12-06, an H100): sandbox_exec applies the
    unit's InaccessiblePaths=; as the engine inside it the token and state/ are denied, the
    same user outside reads the token; then the engine served under that sandbox."""
    seen = json.loads((EVIDENCE / "vllm-secrets.json").read_text())
    assert seen["/opt/servefleet/etc/hf-token"]["rc"] != 0
    assert "Permission denied" in seen["/opt/servefleet/etc/hf-token"]["said"][0]
    assert "Permission denied" in seen["/opt/servefleet/state"]["said"][0]
    assert seen["outside"] == {"rc": 0, "read": "canary-hf-token"}
    lines = json.loads((EVIDENCE / "vllm-server.json").read_text())["sandbox_lines"]
    assert {
        "sandbox_exec: hidden: /opt/servefleet/etc",
        "sandbox_exec: hidden: /opt/servefleet/state",
    } <= set(lines)


def test_without_af_netlink_the_engine_died_at_start():
    """The finding behind vllm.ADDRESS_FAMILIES: gloo looks its address up over netlink."""
    log = (EVIDENCE / "vllm-without-af-netlink.log").read_text()
    assert "gloo/transport/tcp/device.cc" in log
    assert "Address family not supported by protocol" in log
    old = (EVIDENCE / "servefleet-vllm.without-af-netlink.service").read_text()
    assert "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" in old.splitlines()
    assert "AF_NETLINK" in vllm.ADDRESS_FAMILIES


def test_the_probes_passed_under_the_units_and_failed_under_the_old_allow_list():
    steps = (EVIDENCE / "llama-serve-and-probes.txt").read_text()
    for engine in ("llama.cpp", "vllm"):
        assert f"probe {engine} under the unit: rc 0 (as expected)" in steps
        assert re.search(
            rf"probe {engine} under the old allow list: rc [1-9]\d* \(as expected\)", steps
        )
    assert "NOT as expected" not in steps
    assert "No CUDA GPUs are available" in steps
    assert "nvidia-smi reports no usable GPU: No devices were found" in steps
    assert llamacpp.NVIDIA_SMI_PROBE in steps  # the probe the recipe runs, as it runs it
