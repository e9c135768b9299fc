"""deploys/serve_bf16.py on a real testbed spark host: converge, converge again with zero changes,
verify with testinfra; then the checks that must fail only the host concerned.

The host gets the real torch 2.11.0 and vLLM 0.24.0 wheels from the host-side wheelhouse
(python_no_deps: the ~4 GB closure is proven by tests/unit/test_vllm_closure.py), the real
qwen3_5.py patched with its `.orig`, and a tiny Qwen3.5-MoE checkpoint (no visual.*, no mtp.*)
from the local hub; the unit is installed and enabled but stopped by data (no GPU here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys

import pytest

from servefleet.converge import pyinfra
from servefleet.operations.vllm_patch import recorded_patch
from servefleet.paths import REPO_ROOT
from servefleet.testbed import hosts as tb_hosts
from servefleet.testbed.state import load_state
from servefleet.testbed import material
from servefleet.testing.wheels import vllm_wheel, wheel_member

pytestmark = pytest.mark.e2e

HOST = "spark-1"
DEPLOY = "deploys/serve_bf16.py"
REPO = "Qwen/Qwen-AgentWorld-35B-A3B"
BRANCH = "testbed-tiny"  # group_data/testbed_spark.py: model_revision
ROOT = "/opt/servefleet"
VENV = f"{ROOT}/venvs/vllm-0.24.0"
MODEL = f"{ROOT}/models/Qwen--Qwen-AgentWorld-35B-A3B"
UNIT = "/etc/systemd/system/servefleet-vllm.service"
SITE = f"{VENV}/lib/python3.11/site-packages"  # Debian 12's Python 3.11
QWEN = f"{SITE}/vllm/model_executor/models/qwen3_5.py"
GUEST_PYTHON = "3.11"


@pytest.fixture(scope="module")
def bf16(testbed):
    """Wheelhouse stocked and the tiny checkpoint published on the local hub's branch."""
    material.prepare(rtx4090=False)
    return testbed


def converge(data: dict | None = None, limit: str = HOST, *args: str):
    return pyinfra("inventory/testbed.py", DEPLOY, *args, limit=limit, data=data, timeout=1500)


def sha256_on(host, path: str) -> str:
    return host.check_output(f"sha256sum {shlex.quote(path)}").split()[0]


def test_invalid_data_stops_the_run_before_any_change(bf16, th):
    before = th(HOST).file(VENV).exists
    run = converge({"page_cache_policy": "sometimes"})
    assert run.returncode != 0
    assert "'page_cache_policy' = 'sometimes'" in run.output
    assert "Starting operation" not in run.output
    assert th(HOST).file(VENV).exists == before


def test_serve_bf16_converges_then_is_idempotent(bf16, th):
    first = converge()
    assert first.returncode == 0, first.output[-4000:]
    assert first.errors == 0
    second = converge()
    assert second.returncode == 0, second.output[-4000:]
    assert second.changed == 0 and second.no_change == second.operations > 0, second.output[-4000:]


def test_venv_holds_the_pinned_real_wheels(bf16, th):
    host = th(HOST)
    versions = host.check_output(
        f"{VENV}/bin/python -c \"import importlib.metadata as m; "
        f"print(m.version('torch'), m.version('vllm'))\"")
    assert versions == "2.11.0 0.24.0"
    cuda = host.check_output(f"{VENV}/bin/python -c \"import runpy; "
                             f"print(runpy.run_path('{SITE}/torch/version.py')['cuda'])\"")
    assert cuda == "13.0"
    assert host.file(f"{VENV}/bin/vllm").exists


def test_qwen3_5_is_patched_with_its_orig(bf16, th):
    host = th(HOST)
    recorded = recorded_patch("0.24.0")
    assert sha256_on(host, QWEN) == recorded.patched_sha256
    assert sha256_on(host, f"{QWEN}.orig") == recorded.pristine_sha256
    shipped = wheel_member(vllm_wheel("0.24.0"), "vllm/model_executor/models/qwen3_5.py")
    assert hashlib.sha256(shipped).hexdigest() == recorded.pristine_sha256


def test_checkpoint_and_unit(bf16, th):
    host = th(HOST)
    for name in ("config.json", "model.safetensors.index.json",
                 "model.safetensors-00001-of-00002.safetensors"):
        f = host.file(f"{MODEL}/{name}")
        assert f.exists and f.user == "servefleet"
    unit = host.file(UNIT)
    assert unit.exists and unit.mode == 0o644
    text = unit.content_string
    for expected in (f"ExecStart={VENV}/bin/vllm serve {MODEL}",
                     f"--served-model-name {REPO}", "--language-model-only", "--max-model-len 262144",
                     "--kv-cache-memory-bytes 8589934592", "--host 127.0.0.1", "--port 8000",
                     "Environment=HF_HUB_OFFLINE=1", "User=servefleet", "Restart=on-failure",
                     "StandardOutput=journal"):
        assert expected in text, expected
    assert "EnvironmentFile" not in text  # no api_key_file by default
    service = host.service("servefleet-vllm")
    assert service.is_enabled and not service.is_running  # service_state = "stopped" (testbed)
    assert host.file(f"{ROOT}/bin/servefleet-vllm-health").mode == 0o755
    assert host.file(f"{ROOT}/bin/servefleet-evict-page-cache").mode == 0o755


def test_lint_fails_this_host_when_the_recipe_would_not_load(bf16, th):
    unit_before = th(HOST).file(UNIT).content_string
    run = converge({"language_model_only": False})
    assert run.returncode != 0
    assert ("Qwen3_5MoeForConditionalGeneration builds a vision tower but the checkpoint has no "
            "visual weights") in run.output
    assert th(HOST).file(UNIT).content_string == unit_before  # stopped before the service step


def test_memory_preflight_fails_this_host_with_the_numbers(bf16, th):
    unit_before = th(HOST).file(UNIT).content_string
    run = converge({"kv_cache_memory_bytes": 64 << 20})
    assert run.returncode != 0
    # The tiny checkpoint's config: 500 blocks of 270,336 bytes for one 262,144-token request.
    assert ("memory preflight failed on spark-1: vLLM would refuse to start: one 262,144-token "
            "request needs 0.13 GiB (135,168,000 bytes) of KV cache, the pool is 0.06 GiB "
            "(67,108,864 bytes); it holds at most 129,360 tokens per request") in run.output
    over = converge({"usable_memory_bytes": 10 * 1024**3})
    assert over.returncode != 0
    assert "weights 0.01 + KV pool 8.0 + overhead 4.0 = 12.01 GiB > 10.0 GiB usable" in over.output
    assert th(HOST).file(UNIT).content_string == unit_before


def test_cuda_build_mismatch_fails_with_both_values(bf16, th):
    run = converge({"torch_cuda": '"12.8"'})  # JSON-quoted: --data would read 12.8 as a float
    assert run.returncode != 0
    assert f"torch.version.cuda is 13.0 in {VENV}, the recipe needs CUDA 12.8" in run.output


def test_page_cache_purge_runs_only_when_it_applies(bf16, th):
    host = th(HOST)
    record = f"{ROOT}/state/page-cache-evict.json"
    host.run(f"rm -f {record}")
    # Nothing changed: even with policy "always", no purge (zero changes).
    idle = converge({"page_cache_policy": "always"})
    assert idle.returncode == 0 and idle.changed == 0, idle.output[-3000:]
    assert not host.file(record).exists
    # The model changes (a shard is fetched again): the purge runs and reports what it evicted.
    host.run(f"rm {MODEL}/model.safetensors-00002-of-00002.safetensors")
    run = converge({"page_cache_policy": "always"})
    assert run.returncode == 0, run.output[-3000:]
    report = json.loads(host.file(record).content_string)
    assert report["path"] == MODEL and report["files"] >= 4
    assert report["evicted"] == report["resident_before"] - report["resident_after"]
    assert report["resident_after"] == 0
    # Global drop_caches only when asked: /proc/sys is read-only in these guests, so it fails,
    # named, and is not faked.
    host.run(f"rm {MODEL}/model.safetensors-00002-of-00002.safetensors")
    dropped = converge({"page_cache_policy": "always", "page_cache_drop_global": True})
    assert dropped.returncode != 0
    assert "/proc/sys/vm/drop_caches" in dropped.output
    assert "failed" in json.loads(host.file(record).content_string)["drop_caches"]
    assert converge().returncode == 0


def test_api_key_file_goes_to_an_environment_file(bf16, th, tmp_path):
    host = th(HOST)
    key = tmp_path / "api-key"
    key.write_text("sk-testbed-123\n")
    run = converge({"api_key_file": str(key)})
    assert run.returncode == 0, run.output[-3000:]
    env = host.file(f"{ROOT}/etc/vllm.env")
    assert env.mode == 0o600 and env.user == "root"
    assert env.content_string == "VLLM_API_KEY=sk-testbed-123\n"
    assert f"EnvironmentFile={ROOT}/etc/vllm.env" in host.file(UNIT).content_string
    assert "sk-testbed" not in host.file(UNIT).content_string  # never on the command line
    back = converge()
    assert back.returncode == 0
    assert not host.file(f"{ROOT}/etc/vllm.env").exists
    assert converge().changed == 0


def test_patch_refusal_fails_only_that_host(bf16, th):
    """vllm_patch.apply on two hosts, one with a locally edited qwen3_5.py: that host fails
    with the hashes and the fix, untouched; the other is patched in the same run."""
    wheel = vllm_wheel("0.24.0")
    shipped = wheel_member(wheel, "vllm/model_executor/models/qwen3_5.py")
    metadata = wheel_member(wheel, "vllm-0.24.0.dist-info/METADATA")
    venv = "/tmp/sf-patch-venv"
    site = f"{venv}/lib/python3.11/site-packages"
    other = "rtx4090-1"
    for name in (HOST, other):
        host = th(name)
        host.run(f"rm -rf {venv}; mkdir -p {site}/vllm/model_executor/models "
                 f"{site}/vllm-0.24.0.dist-info {venv}/bin && ln -s /usr/bin/python3 {venv}/bin/python")
        address = load_state().hosts[name].address
        for data, path in ((shipped, f"{site}/vllm/model_executor/models/qwen3_5.py"),
                           (metadata, f"{site}/vllm-0.24.0.dist-info/METADATA")):
            subprocess.run([*tb_hosts.ssh_base_args(), f"root@{address}", f"cat > {path}"],
                           input=data, check=True)
    edited = f"{site}/vllm/model_executor/models/qwen3_5.py"
    th(HOST).run(f"echo '# local edit' >> {edited}")
    edited_sha = sha256_on(th(HOST), edited)

    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "--limit", HOST, "--limit", other,
         "inventory/testbed.py", "servefleet.operations.vllm_patch.apply", f"venv={venv}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_COLOR": "1"})
    output = run.stdout + run.stderr

    assert run.returncode != 0
    assert f"servefleet: {HOST}: vLLM 0.24.0 in {venv}: the file has sha256 {edited_sha}" in output
    assert "pip install --force-reinstall --no-deps vllm==0.24.0" in output
    assert f"[{other}] Success" in output
    assert sha256_on(th(HOST), edited) == edited_sha
    assert not th(HOST).file(f"{edited}.orig").exists
    assert sha256_on(th(other), edited) == recorded_patch("0.24.0").patched_sha256
    for name in (HOST, other):
        th(name).run(f"rm -rf {venv}")
