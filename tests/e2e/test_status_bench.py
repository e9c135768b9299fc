"""`servefleet status` and `servefleet bench` against both serving recipes on the testbed: the
real llama-server of the 4090 recipe and the vLLM engine stand-in under the real unit, each with
an API key; through the sudo user like every other verb."""

import json
import os
import subprocess
import sys

import pytest

from servefleet_dev.testbed import material
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra

pytestmark = pytest.mark.e2e
LLAMA, SPARK = "rtx4090-1", "spark-1"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]


def cli(*args, env=None):
    return subprocess.run(
        [*CLI, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def keyed(testbed, tmp_path_factory):
    """Both recipes converged with an API key: the keys' file on the operator's side."""
    material.prepare()
    key = tmp_path_factory.mktemp("keys") / "api-key"
    key.write_text("sk-bench-status-0123\n")
    for deploy, host in (("deploys/serve_q4_llamacpp.py", LLAMA), ("deploys/serve_bf16.py", SPARK)):
        run = pyinfra(
            "inventory/testbed.py",
            deploy,
            limit=host,
            timeout=3600,
            data={"api_key_file": str(key)},
        )
        assert run.returncode == 0, run.output[-3000:]
    yield ["--data", f"api_key_file={key}"]
    for deploy, host in (("deploys/serve_q4_llamacpp.py", LLAMA), ("deploys/serve_bf16.py", SPARK)):
        pyinfra("inventory/testbed.py", deploy, limit=host, timeout=3600)


@pytest.mark.parametrize("host", [LLAMA, SPARK])
def test_bench_measures_a_key_protected_node(keyed, host, th):
    # The key is refused without it: the bench below must send it (from the node's key file).
    port = 8080 if host == LLAMA else 8000
    # (llama-server leaves /health and /v1/models public: ask for a completion.)
    assert (
        th(host).check_output(
            f"curl -s -o /dev/null -w '%{{http_code}}' -X POST "
            f"-H 'Content-Type: application/json' -d '{{}}' "
            f"http://127.0.0.1:{port}/v1/chat/completions"
        )
        == "401"
    )
    out = cli(
        "bench",
        "inventory/testbed.py",
        "--limit",
        host,
        "--runs",
        "3",
        "--prompt-tokens",
        "256",
        "--max-tokens",
        "32",
        "--json",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    doc = json.loads(out.stdout)  # {"hosts": {name: ...}, "summary", "exit_code"}
    (node,) = doc["hosts"].values()
    assert doc["summary"]["ok"] == 1 and doc["exit_code"] == 0
    assert node["host"] == host and node["ok"], node
    assert len(node["runs"]) == 3
    assert all(r["completion_tokens"] == 32 for r in node["runs"])  # ignore_eos honoured
    assert node["median_ttft_s"] > 0 and node["median_decode_tok_s"] > 0
    assert node["prompt_tokens"] >= 256
    # A testbed host is no GB10 nor RTX 4090: no roofline figure, and the report says why.
    assert node["roofline_tok_s"] is None and node["roofline_ratio"] is None
    stand_in = "the engine stand-in" if host == SPARK else "served on the CPU"
    assert node["roofline_note"].startswith(f"testbed: {stand_in}"), node


def test_bench_skips_a_node_that_does_not_serve_and_says_so(keyed):
    # A depot has no serving engine: skipped, not a failure (was: connection refused, exit 1);
    # with nothing else selected, nothing was benched (exit 1).
    out = cli("bench", "inventory/testbed.py", "--limit", "depot-1", "--runs", "1", "--json")
    doc = json.loads(out.stdout)
    node = doc["hosts"]["depot-1"]
    assert not node["ok"] and node["skipped"].startswith("no serving engine (role depot)")
    assert doc["summary"]["skipped"] == 1 and out.returncode == doc["exit_code"] == 1
    text = cli(
        "bench",
        "inventory/testbed.py",
        "--limit",
        "depot-1",
        "--limit",
        LLAMA,
        *("--runs", "1", "--prompt-tokens", "256", "--max-tokens", "32"),
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert "depot-1: skipped: no serving engine (role depot)" in text.stdout


def test_status_shows_engine_model_service_health_and_release(keyed):
    out = cli("status", "inventory/testbed.py", "--limit", LLAMA, "--limit", SPARK, "--json")
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["hosts"]
    llama, spark = nodes[LLAMA], nodes[SPARK]
    data = material.RTX4090
    assert llama["role"] == "rtx4090" and llama["engine"] == f"llama.cpp {data['llamacpp_tag']}"
    assert data["llamacpp_commit"][:9] in llama["engine_detail"]
    assert llama["model"] == data["model_repo"] and llama["revision"].startswith("main -> ")
    assert llama["service"] == "active" and llama["enabled"] and llama["health"] == "200"
    assert llama["port"] == data["service_port"] and llama["release"].startswith("llama.cpp ")
    assert spark["role"] == "spark" and spark["engine"] == "vllm 0.24.0"
    assert spark["engine_detail"] == "vLLM 0.24.0 (torch 2.11.0)"
    assert spark["model"] == "Qwen/Qwen-AgentWorld-35B-A3B" and spark["health"] == "200"
    for n in (llama, spark):
        assert 0 < n["memory_used_gib"] <= n["memory_total_gib"]


def test_status_and_drift_fit_80_columns(keyed):
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    for args in (
        ("status", "inventory/testbed.py"),
        ("drift", "inventory/testbed.py", "deploys/serve_q4_llamacpp.py"),
        (
            "drift",
            "inventory/testbed.py",
            "deploys/serve_q4_llamacpp.py",
            "--data",
            "llamacpp_context=4096",
        ),
    ):
        out = cli(*args, env=env)
        lines = out.stdout.splitlines()
        assert lines and all(len(line) <= 80 for line in lines), lines
    status = cli("status", "inventory/testbed.py", env=env).stdout.splitlines()
    assert len(status) == 1 + 3  # a header and one line per host
