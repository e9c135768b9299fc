"""vLLM on an RTX 4090 node (#28): the other combination the fused design could not express,
from data alone. fleet.yml says `role: rtx4090` + `engine: vllm`; on the testbed the host's name
says it (rtx4090-vllm-1). The node class's data (group_data/rtx4090.py: x86_64, discrete
memory, 24 GiB) and the engine's (group_data/vllm.py) meet on one host: the memory preflight
plans with the class's 24 GiB (discrete: no GPU to ask on the testbed), not system memory. The
checkpoint is the testbed's tiny BF16 one with an argv real vLLM served with on the H200 (4096
tokens, a 2 GiB pool: testbed_vllm.py), which the engine stand-in replays.

converge, converge again (0 changes), drift in sync, status naming vLLM, a rollout to vLLM
0.26.0 (its recorded argv), a rollback by hand, and a converge back to the data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from servefleet_dev.testbed import lifecycle, material
from servefleet_dev.testbed.hosts import shared_dir
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra, reads_of_a_noop
from servefleet_dev.testing.wheels import vllm_wheel

pytestmark = pytest.mark.e2e
HOST = "rtx4090-vllm-1"
INVENTORY, DEPLOY = "inventory/testbed.py", "deploys/serve_bf16.py"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
ROOT = "/opt/servefleet"
DATA = material.load("all", "rtx4090", "vllm", "testbed_vllm", "testbed")
# 0.26.0 as recorded on the H200 (tests/fixtures/h200/vllm/0.26.0_patched_flag.vllm.log), as
# tests/e2e/test_rollout.py asks for it: the stand-in replays only argv real vLLM served with.
V026 = ["--data", "vllm_version=0.26.0", "--data", "served_model_name=tiny"]
V026 += ["--data", 'vllm_extra_args=["--enforce-eager"]']


def servefleet(*args: str, timeout: int = 1800) -> tuple[int, dict, str]:
    out = subprocess.run(
        [*CLI, *args, "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def records(th) -> dict:
    return json.loads(th(HOST).file(f"{ROOT}/state/releases.json").content_string)


def health(th) -> str:
    port = DATA["service_port"]
    return th(HOST).check_output(
        f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' http://127.0.0.1:{port}/health || true"
    )


@pytest.fixture(scope="module")
def rtx_vllm(testbed):
    material.prepare(rtx4090=False)
    wheel = vllm_wheel("0.26.0")
    house = shared_dir() / "wheels" / wheel.name
    if not house.exists():
        os.link(wheel, house)
    lifecycle.add(HOST, log=lambda m: None)
    yield HOST
    lifecycle.rm(HOST, log=lambda m: None)


def test_a_4090_node_converges_with_vllm_and_again_changes_nothing(rtx_vllm, th):
    run = pyinfra(INVENTORY, DEPLOY, limit=HOST, timeout=3600)
    assert run.returncode == 0, run.output[-4000:]
    assert health(th) == "200" and DATA["service_port"] == 8000  # vLLM's port on a 4090
    assert not th(HOST).file("/etc/systemd/system/servefleet-llama.service").exists
    again = pyinfra(INVENTORY, DEPLOY, limit=HOST, timeout=1800)
    assert again.returncode == 0 and again.changed == 0, again.output[-3000:]
    # Every fact the steps read is in their plan: 2 commands, as on a Spark (tests/e2e/
    # test_spark.py: the plan, then the patched file's digests); an unplanned read adds one.
    # Drift one more: it writes its verdict to the metrics textfile (issue #30).
    assert reads_of_a_noop(INVENTORY, DEPLOY, HOST) == {"dry": 2, "drift": 3}
    other = pyinfra(INVENTORY, "deploys/serve_q4_llamacpp.py", limit=HOST, timeout=600)
    assert other.returncode == 0 and "acts on llama.cpp hosts only" in other.output


def test_the_memory_preflight_plans_with_the_classs_discrete_memory(rtx_vllm, th):
    """24 GiB of VRAM (group_data/rtx4090.py), whatever the machine's RAM: a budget over it
    fails the host with the numbers, the service untouched."""
    unit = th(HOST).file("/etc/systemd/system/servefleet-vllm.service").content_string
    over = pyinfra(INVENTORY, DEPLOY, limit=HOST, data={"memory_overhead_bytes": "23GiB"})
    assert over.returncode != 0
    assert "overhead 23.0 = 25.01 GiB > 24.0 GiB usable" in over.output, over.output[-3000:]
    assert th(HOST).file("/etc/systemd/system/servefleet-vllm.service").content_string == unit
    assert health(th) == "200"


def test_drift_is_in_sync_with_the_engines_deep_items(rtx_vllm):
    rc, report, err = servefleet("drift", INVENTORY, DEPLOY, "--limit", HOST)
    assert rc == 0, (report, err[-2000:])
    items = {i["name"]: i["state"] for i in report["hosts"][HOST]["items"]}
    assert items["qwen3_5.py (vLLM patch)"] == "in_sync"  # the engine's, by the host's data
    assert items["unit /etc/systemd/system/servefleet-vllm.service"] == "in_sync"


def test_status_names_the_class_and_the_engine(rtx_vllm):
    rc, report, _ = servefleet("status", INVENTORY, "--limit", HOST)
    node = report["hosts"][HOST]
    assert rc == 0 and node["role"] == "rtx4090-vllm", node
    assert node["engine"] == "vllm 0.24.0" and node["health"] == "200", node


def test_a_rollout_and_a_rollback_by_hand(rtx_vllm, th):
    rc, report, err = servefleet("rollout", INVENTORY, DEPLOY, "--limit", HOST, *V026, timeout=3600)
    assert rc == 0 and report["hosts"][HOST]["result"] == "upgraded", (report, err[-3000:])
    assert records(th)["current"]["version"] == "0.26.0" and health(th) == "200"
    rc, report, err = servefleet("rollback", INVENTORY, "--limit", HOST, timeout=900)
    assert rc == 0 and report["hosts"][HOST]["result"] == "rolled back", (report, err[-3000:])
    assert records(th)["current"]["version"] == "0.24.0" and health(th) == "200"
    back = pyinfra(INVENTORY, DEPLOY, limit=HOST, timeout=1800)
    assert back.returncode == 0 and records(th)["current"]["version"] == "0.24.0"
