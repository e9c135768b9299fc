"""The real GPU node (tests/fixtures/h200/node/, made by tests/device/gpunode.sh on the lent
GPU machine: an H200 on 2026-12-03, an H100 80GB HBM3 on the rerun of 2026-12-06, both Hopper,
sm_90, driver 580 with the open module): the 4090 recipe converged a guest with real systemd and the GPU bound in, over SSH as the
sudo admin. These tests hold that evidence to what the issue asks and to today's code: the unit
that served there is exactly what servefleet renders now for that node's data, so a change to
the unit fails here until the H200 run is made again."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from servefleet.core import sandbox
from servefleet.core.groupdata import load_group
from servefleet.core.systemd import render_unit
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet_dev.testbed import gpunode, hosts
from servefleet_dev.testing.h200_since import as_run_on_the_h200

# The lent machine's GPU (the group's CMAKE_CUDA_ARCHITECTURES = 90 is built for either).
LENT_GPU = re.compile(r"NVIDIA H(100|200)\b")
ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "tests" / "fixtures" / "h200" / "node"


def result(step: str) -> dict:
    return json.loads((NODE / f"{step}.json").read_text())


def test_the_device_inventory_gives_the_node_a_4090s_groups_and_the_recipes_data(
    monkeypatch, tmp_path
):
    """tests/device/gpunode/h200_gpu.py, loaded as pyinfra loads it: its host is in the groups a
    4090 of fleet.yml is in (the class's, then its engine's), then the file's; and so it has the
    data the recipe reads (once, the engine's group was missing: no llamacpp_cmake_flags)."""
    monkeypatch.chdir(ROOT)  # group_data/ is read from the current directory, as by the CLI
    monkeypatch.setenv("SERVEFLEET_GPUNODE_DIR", str(tmp_path))  # the carried key, as there
    (tmp_path / "ssh").mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "ssh/id_ed25519")],
        check=True,
    )
    kind, key = (tmp_path / "ssh/id_ed25519.pub").read_text().split()[:2]
    (tmp_path / "ssh/known_hosts").write_text(f"[127.0.0.1]:{gpunode.SSH_PORT} {kind} {key}\n")
    with ctx_state.use(State()):
        inv = make_inventory("tests/device/gpunode/h200_gpu.py", cwd=str(ROOT))
    (host,) = list(inv)
    assert host.name == gpunode.NODE
    assert host.groups == ["rtx4090", "llamacpp", gpunode.GROUP]
    data = host.data.dict()
    assert llamacpp.cmake_flags(data)["CMAKE_CUDA_ARCHITECTURES"] == "90"
    assert data["require_gpu"] is True and data["ssh_key"] == f"{tmp_path}/ssh/id_ed25519"
    assert data["hf_endpoint"] == f"http://127.0.0.1:{gpunode.HUB_PORT}"  # the host's own: its hub
    for key, value in gpunode.recipe_data().items():  # the rest, the groups' in their order
        assert key == "hf_endpoint" or data[key] == value, key


def test_the_group_differs_from_the_4090s_only_where_the_h200_does():
    rtx, h200 = load_group("rtx4090"), load_group(gpunode.GROUP)
    # The GPU's architecture is the node class's (Hopper in place of Ada); the build flags the
    # engine's, as on a 4090: the same flags as before, with 90 where the 4090 has 89.
    assert (rtx["cuda_architectures"], h200["cuda_architectures"]) == ("89", "90")
    assert llamacpp.cmake_flags(gpunode.recipe_data()) == {
        **load_group("llamacpp")["llamacpp_cmake_flags"],
        "CMAKE_CUDA_ARCHITECTURES": "90",
    }
    assert "require_gpu" not in h200 and load_group("all")["require_gpu"] is True
    # What replaces the network there, and the tiny model; nothing of the unit or its sandbox.
    assert set(h200) == {
        "cuda_architectures",
        "llamacpp_git_url",
        "llamacpp_tag",
        "llamacpp_commit",
        "pip_index_url",
        "model_repo",
        "model_file",
        "served_model_name",
        "llamacpp_context_bytes",
    }


def test_the_unit_that_served_on_the_gpu_node_is_todays(monkeypatch):
    monkeypatch.chdir(ROOT)
    served = (NODE / "servefleet-llama.service").read_text()
    model_dir = result("converge")["releases"]["current"]["model_dir"]
    flag = re.search(r"--override-kv (\S+)", served).group(1)
    data = gpunode.recipe_data()
    assert data["require_gpu"] is True
    today = render_unit(
        "files/llamacpp/servefleet-llama.service.j2",
        llamacpp.unit_context(data, model_dir, lambda: flag),
    )
    assert served == as_run_on_the_h200(today), (
        "the llama.cpp unit changed since the H200 run: run tests/device/gpunode.sh again"
    )


def test_the_guest_was_booted_as_the_testbed_boots_its_guests():
    line = (NODE / "nspawn-cmdline.txt").read_text().split()
    assert all(flag in line for flag in hosts.DEVICE_POLICY_ARGS)  # the device filter on
    assert "--boot" in line and "--bind=/dev/nvidia0" in line


def test_the_recipe_converged_the_gpu_node_under_real_systemd():
    doc = result("converge")
    checks = doc["checks"]
    assert doc["ok"] and checks["rc"] == 0 and checks["changed"] > 0
    assert checks["device_policy"] == "closed" and checks["user"] == "servefleet"
    assert checks["override_kv"]  # the lint's fix for the tiny GGUF's missing MTP layer
    show = doc["serving"]["systemctl_show"]
    assert show["ActiveState"] == "active" and show["User"] == "servefleet"
    assert show["MemoryDenyWriteExecute"] == "yes"
    allowed = set(show["DeviceAllow"].split(", "))
    assert {f"char-{g} rw" for g in sandbox.NVIDIA_DEVICE_GROUPS} <= allowed
    assert doc["systemd"].startswith("systemd 252") and doc["systemd"].endswith("running")
    assert LENT_GPU.match(doc["gpu"]) and ", 580." in doc["gpu"]
    assert doc["serving"]["health"] == "200" and doc["serving"]["chat_role"] == "assistant"
    # The weights on the GPU: llama-server (the unit's main process) holds GPU memory, and its
    # log lists CUDA0. b9785 prints no "offloaded N/N layers" line at its default verbosity.
    pid = show["MainPID"]
    assert any(
        line.split(",")[0] == pid and "llama-server" in line
        for line in doc["serving"]["gpu_apps"].splitlines()
    )
    assert any("CUDA0" in line and LENT_GPU.search(line) for line in doc["serving"]["journal"])
    assert any(
        "servefleet preflight: ok" in line and "VRAM free" in line
        for line in doc["serving"]["journal"]
    )
    build = json.loads(doc["build"])
    assert build["cmake_flags"]["GGML_CUDA"] == "ON"
    assert build["cmake_flags"]["CMAKE_CUDA_ARCHITECTURES"] == "90"
    assert build["commit"] == gpunode.recipe_data()["llamacpp_commit"]
    # The recipe's probe under the installed unit's sandbox lists the GPU (a `GPU ` line).
    assert doc["probe_output"].startswith("rc 0\nGPU 0: ")
    assert LENT_GPU.match(doc["probe_output"].split("GPU 0: ", 1)[1])


def test_the_second_converge_changed_nothing_and_drift_is_in_sync():
    again = result("again")["checks"]
    assert again["rc"] == 0 and again["changed"] == 0 and again["operations"] > 0
    assert again["same_pid"]
    assert result("drift")["checks"]["rc"] == 0


def test_a_rollout_passed_its_gates_and_recorded_gpu_figures():
    doc = result("rollout")
    assert doc["ok"] and doc["checks"]["rc"] == 0
    perf = doc["releases"]["current"]["perf"]
    assert perf and perf["decode_tok_s"] > 0 and perf["ttft_s"] > 0
    assert doc["releases"]["current"]["id_of_unit"] == ["32768"]


def test_the_rollback_was_probed_before_its_restart():
    doc = result("rollback")
    assert doc["ok"] and doc["releases"]["current"]["id_of_unit"] == ["65536"]
    journal = doc["probe_journal"]
    probe = next(i for i, line in enumerate(journal) if "probe" in line and "Started" in line)
    restarts = [i for i, line in enumerate(journal) if "Started" in line and "probe" not in line]
    assert restarts and max(restarts) > probe  # the probe, then the start it allowed


def test_a_converge_after_all_that_returns_the_node_to_the_data():
    checks = result("final")["checks"]
    assert checks["rc"] == 0 and checks["healthy"]
    assert checks["status_rc"] == 0 and checks["drift_rc"] == 0


def test_a_unit_without_char_nvidia_was_refused_and_the_server_kept_serving():
    doc = result("broken")
    checks = doc["checks"]
    assert doc["ok"] and checks["rc"] != 0
    assert "nvidia-smi -L lists no GPU" in checks["refused_line"][0]
    assert checks["unit_unchanged"] and checks["same_pid"] and checks["still_healthy"]


def test_the_engine_under_real_systemd_could_not_read_the_token_or_the_records():
    """#27 rule 1 on the GPU node: from inside the running llama-server's own mount namespace,
    uid and gid (nsenter into it), the hub token and root's records are denied, the models
    are read; the same user outside the sandbox reads the token (the unit hides it)."""
    doc = result("secrets")
    checks, seen = doc["checks"], doc["seen"]
    assert doc["ok"] and checks["token_hidden"] and checks["records_hidden"]
    assert checks["models_seen"] and checks["outside_reads"]
    assert checks["unit_says"] == "-/opt/servefleet/etc -/opt/servefleet/state"
    for path in ("/opt/servefleet/etc/hf-token", "/opt/servefleet/state/releases.json"):
        assert "Permission denied" in seen[path]["said"], seen[path]
    assert "servefleet-tests--tiny-qwen35moe" in seen["/opt/servefleet/models"]["said"]


@pytest.mark.parametrize(
    "step", ["converge", "again", "drift", "rollout", "rollback", "broken", "secrets", "final"]
)
def test_every_step_of_the_h200_run_is_recorded(step):
    assert result(step)["ok"], f"{step} failed on the GPU node: see {step}.log"
