"""llama.cpp on a DGX Spark node (#28): the combination the fused design could not express,
from data alone. fleet.yml says `role: spark` + `engine: llamacpp`; on the testbed the host's name
says it (spark-llamacpp-1). The node class's data (group_data/spark.py: aarch64, sm_121, unified
memory) and the engine's (group_data/llamacpp.py: the Q4 GGUF) meet on one host; the build flags
take the class's CUDA architecture 121 (tests/unit/test_engines.py), while on the testbed an
x86_64 guest builds for its CPU as the 4090 recipe does (testbed_llamacpp.py). No deploy of its
own: deploys/serve_q4_llamacpp.py acts on every llama.cpp host, whatever its class.

converge, converge again (0 changes), drift in sync, status naming llama.cpp, a rollout to the
patch release, a rollback by hand, and a converge back to the data.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servefleet.engines.llamacpp import logic as llamacpp
from servefleet_dev.testbed import lifecycle, material
from servefleet_dev.testing.llama_src import commits
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra, reads_of_a_noop

pytestmark = pytest.mark.e2e
HOST = "spark-llamacpp-1"
INVENTORY, DEPLOY = "inventory/testbed.py", "deploys/serve_q4_llamacpp.py"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
ROOT = "/opt/servefleet"
NEWER = "b9785-patch1"  # the rollouts' upgrade: a later commit, no compiled change (ccache)
DATA = material.load("all", "spark", "llamacpp", "testbed_llamacpp", "testbed")


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
def spark_llama(testbed):
    material.prepare(spark=False)
    lifecycle.add(HOST, log=lambda m: None)
    yield HOST
    lifecycle.rm(HOST, log=lambda m: None)


def test_a_spark_node_converges_with_llamacpp_and_again_changes_nothing(spark_llama, th):
    run = pyinfra(INVENTORY, DEPLOY, limit=HOST, timeout=3600)
    assert run.returncode == 0, run.output[-4000:]
    assert health(th) == "200" and DATA["service_port"] == 8080  # the engine's port, not all.py's
    unit = th(HOST).file("/etc/systemd/system/servefleet-llama.service").content_string
    assert llamacpp.build_name(DATA) in unit and "--override-kv" in unit
    assert not th(HOST).file("/etc/systemd/system/servefleet-vllm.service").exists
    again = pyinfra(INVENTORY, DEPLOY, limit=HOST, timeout=1800)
    assert again.returncode == 0 and again.changed == 0, again.output[-3000:]
    # Every fact the steps read is in their plan: a no-op check reads the node in 1 command, as
    # on a 4090 (tests/e2e/test_llamacpp.py); an unplanned read would add one. Drift one more:
    # it writes its verdict to the metrics textfile (issue #30).
    assert reads_of_a_noop(INVENTORY, DEPLOY, HOST) == {"dry": 1, "drift": 2}
    # vLLM's deploy on this host is a visible no-op: it serves llama.cpp.
    other = pyinfra(INVENTORY, "deploys/serve_bf16.py", limit=HOST, timeout=600)
    assert other.returncode == 0 and "acts on vLLM hosts only" in other.output, other.output[-2000:]


def test_drift_is_in_sync_with_the_engines_deep_items(spark_llama):
    rc, report, err = servefleet("drift", INVENTORY, DEPLOY, "--limit", HOST)
    assert rc == 0, (report, err[-2000:])
    items = {i["name"]: i["state"] for i in report["hosts"][HOST]["items"]}
    assert items["llama.cpp current build"] == "in_sync"  # the engine's, by the host's data
    assert items["unit /etc/systemd/system/servefleet-llama.service"] == "in_sync"


def test_status_names_the_class_and_the_engine(spark_llama):
    rc, report, _ = servefleet("status", INVENTORY, "--limit", HOST)
    node = report["hosts"][HOST]
    assert rc == 0 and node["role"] == "spark-llamacpp", node
    assert node["engine"] == "llama.cpp b9785" and node["health"] == "200", node
    assert node["release"].startswith("llama.cpp b9785"), node


def test_a_rollout_and_a_rollback_by_hand(spark_llama, th):
    newer = ["--data", f"llamacpp_tag={NEWER}", "--data", f"llamacpp_commit={commits()[NEWER]}"]
    rc, report, err = servefleet(
        "rollout", INVENTORY, DEPLOY, "--limit", HOST, "--no-perf-gate", *newer, timeout=3600
    )
    assert rc == 0 and report["hosts"][HOST]["result"] == "upgraded", (report, err[-3000:])
    assert records(th)["current"]["version"] == NEWER and health(th) == "200"
    rc, report, err = servefleet("rollback", INVENTORY, "--limit", HOST, timeout=900)
    assert rc == 0 and report["hosts"][HOST]["result"] == "rolled back", (report, err[-3000:])
    current = records(th)["current"]
    assert current["version"] == "b9785" and health(th) == "200"
    # the engine's `current` link went back with it (Engine.current_link)
    assert th(HOST).file(f"{ROOT}/llama.cpp/current").linked_to == current["prefix"]
    back = pyinfra(INVENTORY, DEPLOY, limit=HOST, timeout=1800)  # the data's release, as before
    assert back.returncode == 0 and records(th)["current"]["version"] == "b9785"
