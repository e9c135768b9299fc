"""The recipes' deep drift checks (servefleet/verbs/deep_drift.py) on real testbed hosts.

Both recipes are converged once (module fixture); each case makes one kind of drift by hand, the
check (CLI, --json) exits 1 and names it (item name, expected, found), a converge repairs the
host and the check exits 0 again, so the next case starts from a converged host.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from servefleet.engines.llamacpp import logic as llamacpp
from servefleet.engines.vllm.operations.patch import recorded_patch
from servefleet_dev.testbed import guest, hosts as tb_hosts, material
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra
from servefleet_dev.testing.wheels import vllm_wheel

pytestmark = pytest.mark.e2e

INVENTORY = "inventory/testbed.py"
SPARK, LLAMA = "spark-1", "rtx4090-1"
BF16, Q4 = "deploys/serve_bf16.py", "deploys/serve_q4_llamacpp.py"
ROOT = "/opt/servefleet"
VENV = f"{ROOT}/venvs/vllm-0.24.0"
MODELS = f"{ROOT}/models/Qwen--Qwen-AgentWorld-35B-A3B"
SHARD = "model.safetensors-00002-of-00002.safetensors"
VLLM_UNIT = "/etc/systemd/system/servefleet-vllm.service"
PATCH = recorded_patch("0.24.0")


def qwen() -> str:
    """qwen3_5.py in the vLLM venv, under the guest's own Python (it is asked)."""
    site = guest.site_packages(load_state().hosts[SPARK], VENV)
    return f"{site}/vllm/model_executor/models/qwen3_5.py"


UV = (
    f"UV_CACHE_DIR=/var/cache/servefleet/uv UV_LINK_MODE=copy UV_NO_PROGRESS=1 "
    f"{ROOT}/tools/venv/bin/uv pip install --quiet --python {VENV}/bin/python --no-deps "
    f"--no-index --find-links /var/cache/servefleet/wheels"
)
DATA = material.RTX4090


CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]


def model_dir(h) -> str:
    """The checkpoint's directory on the host: the branch resolved to its commit."""
    return h.check_output(f"ls -d {MODELS}/*/").split()[-1].rstrip("/")


def drift(deploy: str, host: str, **data):
    args = [*CLI, "drift", INVENTORY, deploy, "--limit", host, "--json"]
    for key, value in data.items():
        args += ["--data", f"{key}={value}"]
    start = time.monotonic()
    proc = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True)
    print(
        f"[drift] {deploy} {host} {data or ''}: exit {proc.returncode}, "
        f"{time.monotonic() - start:.1f} s"
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return proc.returncode, report


def deep(report, host) -> dict[str, dict]:
    return {i["name"]: i for i in report["hosts"][host]["items"] if i["kind"] == "deep"}


def drifted(report, host) -> dict[str, dict]:
    return {n: i for n, i in deep(report, host).items() if i["state"] == "drifted"}


def converge(deploy: str, host: str, **data):
    start = time.monotonic()
    run = pyinfra(INVENTORY, deploy, limit=host, data=data, timeout=40 * 60)
    print(
        f"[converge] {deploy} {host} {data or ''}: rc {run.returncode}, {run.changed} changed, "
        f"{time.monotonic() - start:.0f} s"
    )
    return run


def repaired(deploy: str, host: str, **data):
    """Converge, then the check is clean (exit 0, no deep item drifted)."""
    run = converge(deploy, host, **data)
    assert run.returncode == 0, run.output[-4000:]
    rc, report = drift(deploy, host, **data)
    assert rc == 0 and not drifted(report, host), report["hosts"][host]
    return run


def sha256_on(h, path: str) -> str:
    return h.check_output(f"sha256sum {shlex.quote(path)}").split()[0]


@pytest.fixture(scope="module")
def recipes(testbed):
    """Both recipes converged once on their testbed hosts."""
    material.prepare()
    for deploy, host in ((BF16, SPARK), (Q4, LLAMA)):
        run = converge(deploy, host)
        assert run.returncode == 0, run.output[-5000:]
    return testbed


def test_converged_recipes_are_in_sync_with_their_deep_items(recipes, th):
    rc, report = drift(BF16, SPARK)
    assert rc == 0, report
    items = deep(report, SPARK)
    assert {i["state"] for i in items.values()} == {"in_sync"}
    assert items[f"vllm version in {VENV}"]["found"] == "0.24.0"
    assert items[f"torch version in {VENV}"]["found"] == "2.11.0"
    assert items["torch.version.cuda"]["found"] == "13.0"
    assert items["qwen3_5.py (vLLM patch)"]["found"].startswith(PATCH.patched_sha256)
    assert items["qwen3_5.py.orig (pristine backup)"]["found"].startswith(PATCH.pristine_sha256)
    assert items[f"unit {VLLM_UNIT}"]["found"] == "same content"
    model = items[f"model Qwen/Qwen-AgentWorld-35B-A3B in {model_dir(th(SPARK))}"]
    assert model["expected"].startswith("Qwen/Qwen-AgentWorld-35B-A3B@testbed-tiny = ")
    assert model["found"] == model["expected"]  # the recorded sha is the branch's sha
    assert items["servefleet-vllm.service active"]["found"] == "running"  # the stand-in serves
    assert items["servefleet-vllm.service enabled"]["found"] == "enabled"
    assert items["release"]["found"].startswith("vllm 0.24.0 (")
    assert items["running release"]["state"] == "in_sync"

    rc, report = drift(Q4, LLAMA)
    assert rc == 0, report
    items = deep(report, LLAMA)
    assert {i["state"] for i in items.values()} == {"in_sync"}
    assert items["llama.cpp current build"]["found"] == llamacpp.build_name(DATA)
    assert items["llama.cpp commit"]["found"] == DATA["llamacpp_commit"]
    assert "GGML_CUDA=OFF" in items["llama.cpp CMake flags"]["found"]
    assert items["servefleet-llama.service active"]["found"] == "running"
    assert items["unit /etc/systemd/system/servefleet-llama.service"]["found"] == "same content"


def test_deep_drift_items_apply_only_to_their_recipe(recipes):
    rc, report = drift("deploys/base.py", SPARK)
    assert rc == 0 and deep(report, SPARK) == {}
    rc, report = drift(BF16, LLAMA)  # the BF16 recipe on the llama.cpp host: nothing to check
    assert deep(report, LLAMA) == {}


def test_hand_edited_unit_is_shown_as_a_diff(recipes, th):
    th(SPARK).run(f"sed -i 's/--max-model-len 4096/--max-model-len 2048/' {VLLM_UNIT}")
    rc, report = drift(BF16, SPARK)
    assert rc == 1
    (name,) = drifted(report, SPARK)
    assert name == f"unit {VLLM_UNIT}"
    found = drifted(report, SPARK)[name]["found"]
    assert "-    --max-model-len 4096 \\" in found and "+    --max-model-len 2048 \\" in found
    repaired(BF16, SPARK)


def test_reverted_patch(recipes, th):
    th(SPARK).run(f"mv -f {qwen()}.orig {qwen()}")  # what vllm_patch.revert does
    rc, report = drift(BF16, SPARK)
    assert rc == 1
    items = drifted(report, SPARK)
    assert set(items) == {"qwen3_5.py (vLLM patch)", "qwen3_5.py.orig (pristine backup)"}
    patch = items["qwen3_5.py (vLLM patch)"]
    assert patch["expected"] == f"{PATCH.patched_sha256} (patched for vLLM 0.24.0)"
    assert patch["found"] == f"{PATCH.pristine_sha256} (vLLM 0.24.0's own file)"
    assert items["qwen3_5.py.orig (pristine backup)"]["found"] == "absent"
    repaired(BF16, SPARK)


def test_replaced_orig(recipes, th):
    h = th(SPARK)
    h.run(f"echo '# not vLLM' > {qwen()}.orig")
    bogus = sha256_on(h, f"{qwen()}.orig")
    rc, report = drift(BF16, SPARK)
    assert rc == 1
    (item,) = drifted(report, SPARK).values()
    assert item["name"] == "qwen3_5.py.orig (pristine backup)"
    assert item["expected"] == f"{PATCH.pristine_sha256} (vLLM 0.24.0's own file)"
    assert item["found"] == f"{bogus} (unknown content)"
    # The recipe refuses to guess (the backup is not vLLM's file) and says how to fix it ...
    run = converge(BF16, SPARK)
    assert run.returncode != 0
    assert f"the backup {qwen()}.orig has sha256 {bogus}, not the pristine" in run.output
    # ... which is done here: backup moved away, vLLM's files reinstalled; then a converge.
    assert h.run(f"rm {qwen()}.orig && {UV} --force-reinstall vllm==0.24.0").rc == 0
    repaired(BF16, SPARK)


def test_upgraded_vllm_in_the_venv(recipes, th):
    wheel = vllm_wheel("0.26.0")
    house = tb_hosts.shared_dir() / "wheels" / wheel.name
    added = not house.exists()
    if added:
        os.link(wheel, house)
    try:
        assert th(SPARK).run(f"{UV} vllm==0.26.0").rc == 0
        rc, report = drift(BF16, SPARK)
        assert rc == 1
        items = drifted(report, SPARK)
        version = items[f"vllm version in {VENV}"]
        assert (version["expected"], version["found"]) == ("0.24.0", "0.26.0")
        # vLLM 0.26.0's own qwen3_5.py replaced the patched 0.24.0 one (named by its hash).
        assert (
            items["qwen3_5.py (vLLM patch)"]["found"]
            == f"{recorded_patch('0.26.0').pristine_sha256} (vLLM 0.26.0's own file)"
        )
        assert f"torch version in {VENV}" not in items
        repaired(BF16, SPARK)
    finally:
        if added:
            house.unlink()


def test_deleted_model_file(recipes, th):
    model = model_dir(th(SPARK))
    th(SPARK).run(f"rm {model}/{SHARD}")
    rc, report = drift(BF16, SPARK)
    assert rc == 1, json.dumps(report, indent=1)[-3000:]
    (item,) = drifted(report, SPARK).values()
    assert item["name"] == f"model Qwen/Qwen-AgentWorld-35B-A3B in {model}"
    assert item["found"] == f"no verified copy (missing: {SHARD})"
    repaired(BF16, SPARK)
    assert th(SPARK).file(f"{model}/{SHARD}").exists


def test_stopped_service(recipes, th):
    th(LLAMA).run("systemctl stop servefleet-llama.service")
    rc, report = drift(Q4, LLAMA)
    assert rc == 1
    (item,) = drifted(report, LLAMA).values()
    assert (item["name"], item["expected"], item["found"]) == (
        "servefleet-llama.service active",
        "running",
        "stopped",
    )
    repaired(Q4, LLAMA)
    assert th(LLAMA).service("servefleet-llama.service").is_running


def test_changed_build_flag_in_data(recipes, th):
    old = llamacpp.build_name(DATA)
    # LLAMA_TOOLS_INSTALL only changes install rules: same compile lines, so ccache hits.
    flags = {**DATA["llamacpp_cmake_flags"], "LLAMA_TOOLS_INSTALL": "OFF"}
    new = llamacpp.build_name({**DATA, "llamacpp_cmake_flags": flags})
    changed = {"llamacpp_cmake_flags": json.dumps(flags)}

    # Data asks for a flag the installed build lacks.
    rc, report = drift(Q4, LLAMA, **changed)
    assert rc == 1
    items = drifted(report, LLAMA)
    # The unit names its build's prefix: it differs too.
    assert set(items) == {
        "llama.cpp current build",
        "llama.cpp CMake flags",
        "unit /etc/systemd/system/servefleet-llama.service",
    }
    assert (
        items["llama.cpp current build"]["expected"],
        items["llama.cpp current build"]["found"],
    ) == (new, old)
    assert (
        items["llama.cpp CMake flags"]["expected"],
        items["llama.cpp CMake flags"]["found"],
    ) == ("LLAMA_TOOLS_INSTALL=OFF", "LLAMA_TOOLS_INSTALL unset")

    # Converged with the new flag, the same data is in sync; the shipped data now drifts back.
    repaired(Q4, LLAMA, **changed)
    rc, report = drift(Q4, LLAMA)
    assert rc == 1
    items = drifted(report, LLAMA)
    assert (
        items["llama.cpp current build"]["expected"],
        items["llama.cpp current build"]["found"],
    ) == (old, new)
    assert (
        items["llama.cpp CMake flags"]["expected"],
        items["llama.cpp CMake flags"]["found"],
    ) == ("LLAMA_TOOLS_INSTALL unset", "LLAMA_TOOLS_INSTALL=OFF")
    assert "llama.cpp commit" not in items  # the same pinned commit
    repaired(Q4, LLAMA)  # back to the shipped flags: the old build is kept, `current` moves
    assert th(LLAMA).file(f"{ROOT}/llama.cpp/current").linked_to == f"{ROOT}/llama.cpp/{old}"
