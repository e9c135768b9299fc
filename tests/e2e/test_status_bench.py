"""`servefleet status` and `servefleet bench` against the real llama-server of the 4090 recipe."""

import json
import subprocess
import sys

import pytest

from servefleet.converge import pyinfra
from servefleet.paths import REPO_ROOT
from servefleet.testbed import material

pytestmark = pytest.mark.e2e
HOST = "rtx4090-1"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "servefleet.cli", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def serving(testbed):
    material.prepare(spark=False)
    run = pyinfra("inventory/testbed.py", "deploys/serve_q4_llamacpp.py", limit=HOST,
                  timeout=3600)
    assert run.returncode == 0, run.output[-3000:]
    return testbed


def test_bench_measures_the_llama_node(serving):
    out = cli("bench", "inventory/testbed.py", "--limit", HOST, "--runs", "3",
              "--prompt-tokens", "256", "--max-tokens", "32", "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    (node,) = json.loads(out.stdout)
    assert node["host"] == HOST and node["ok"]
    assert len(node["runs"]) == 3
    assert all(r["completion_tokens"] == 32 for r in node["runs"])  # ignore_eos honoured
    assert node["median_ttft_s"] > 0 and node["median_decode_tok_s"] > 0
    assert node["prompt_tokens"] >= 256
    # no memory bandwidth in the testbed's data: no roofline claimed
    assert node["roofline_tok_s"] is None


def test_bench_names_a_node_that_does_not_serve(serving):
    out = cli("bench", "inventory/testbed.py", "--limit", "depot-1", "--runs", "1", "--json")
    assert out.returncode == 1
    (node,) = json.loads(out.stdout)
    assert not node["ok"] and node["error"]


def test_status_shows_engine_model_service_and_health(serving):
    out = cli("status", "inventory/testbed.py", "--limit", HOST, "--json")
    assert out.returncode == 0, out.stderr
    (node,) = json.loads(out.stdout)
    data = material.RTX4090
    assert node["role"] == "rtx4090"
    assert node["engine"].startswith("llama.cpp ") and data["llamacpp_commit"][:9] in node["engine"]
    assert node["model"] == data["model_repo"] and node["revision"].startswith("main -> ")
    assert node["service"] == "active, enabled" and node["health"] == "200"
    assert node["port"] == data["service_port"]
    assert 0 < node["memory_used_gib"] <= node["memory_total_gib"]
