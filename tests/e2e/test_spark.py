"""deploys/serve_bf16.py on a real testbed spark host: converge, converge again with zero changes,
verify with testinfra; the vLLM service path runs for real, with the engine stand-in in place of
vLLM (the testbed has no GPU); then the checks that must fail only the host concerned.

The host gets the real torch 2.11.0 and vLLM 0.24.0 wheels from the host-side wheelhouse
(python_no_deps: the ~4 GB closure is proven by tests/unit/test_vllm_closure.py), the real
qwen3_5.py patched with its `.orig`, a tiny Qwen3.5-MoE checkpoint (no visual.*, no mtp.*) from
the local hub, and the real unit, hardened, whose executable is the stand-in: it replays the
engine lines recorded on an H200 for this checkpoint at 4096 tokens / 2 GiB.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from servefleet.engines.vllm.operations.patch import recorded_patch
from servefleet_dev.testbed import guest, hosts as tb_hosts, material
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra, reads_of_a_noop
from servefleet_dev.testing.wheels import vllm_wheel, wheel_member

pytestmark = pytest.mark.e2e

HOST = "spark-1"
DEPLOY = "deploys/serve_bf16.py"
REPO = "Qwen/Qwen-AgentWorld-35B-A3B"
ROOT = "/opt/servefleet"
VENV = f"{ROOT}/venvs/vllm-0.24.0"
UNIT = "/etc/systemd/system/servefleet-vllm.service"
STANDIN_CONTROL = "/etc/servefleet-standin"
RESTART_SEC = 10  # the unit's RestartSec


@pytest.fixture(scope="module")
def bf16(testbed):
    """Wheelhouse stocked, the stand-in installed, the tiny checkpoint on the local hub."""
    material.prepare(rtx4090=False)
    return testbed


def site(name: str = HOST, venv: str = VENV) -> str:
    """A venv's site-packages on that host, made with the guest's own Python (it is asked)."""
    return guest.site_packages(load_state().hosts[name], venv)


def qwen(name: str = HOST, venv: str = VENV) -> str:
    return f"{site(name, venv)}/vllm/model_executor/models/qwen3_5.py"


def converge(data: dict | None = None, limit: str = HOST, *args: str):
    return pyinfra("inventory/testbed.py", DEPLOY, *args, limit=limit, data=data, timeout=1500)


def model_dir(host) -> str:
    """The checkpoint's directory: the branch resolved to its commit."""
    out = host.check_output(f"ls -d {ROOT}/models/Qwen--Qwen-AgentWorld-35B-A3B/*/")
    return out.split()[-1].rstrip("/")


def sha256_on(host, path: str) -> str:
    return host.check_output(f"sha256sum {shlex.quote(path)}").split()[0]


def test_invalid_data_stops_the_run_before_any_change(bf16, th):
    before = th(HOST).file(VENV).exists
    run = converge({"page_cache_policy": "sometimes"})
    assert run.returncode == 2
    assert "'page_cache_policy' = 'sometimes'" in run.output
    assert "Starting operation" not in run.output and "Connecting" not in run.output
    assert th(HOST).file(VENV).exists == before


def test_serve_bf16_converges_serves_then_is_idempotent(bf16, th):
    # From no unit at all (earlier tests may have converged this host): a first start follows.
    th(HOST).run(
        "systemctl disable --now servefleet-vllm.service; "
        "rm -f /etc/systemd/system/servefleet-vllm.service; systemctl daemon-reload"
    )
    first = converge()
    assert first.returncode == 0, first.output[-4000:]
    assert first.errors == 0
    # The unit's sandbox was tried before the start: the stand-in's --version under it.
    probe = "Sandbox probe of servefleet-vllm.service (before the restart)"
    # pyinfra's results table: Operation, Hosts, Success, Error, No Change.
    assert re.search(rf"{re.escape(probe)}\s+1\s+1\s+-\s+-", first.output), first.output[-4000:]
    host = th(HOST)
    assert host.service("servefleet-vllm").is_running
    # The health step ran after the start: /health, the KV lines of this start vs plan-kv,
    # a chat; then the release was recorded as running healthy.
    journal = host.check_output("journalctl -u servefleet-vllm --no-pager -o cat")
    assert "GPU KV cache size: 2,957,684 tokens" in journal
    assert "Maximum concurrency for 4,096 tokens per request: 722.09x" in journal
    assert re.search(r'"POST /v1/chat/completions HTTP/1.1" 200', journal)
    releases = json.loads(host.file(f"{ROOT}/state/releases.json").content_string)
    running = json.loads(host.file(f"{ROOT}/state/running.json").content_string)
    assert running["release"] and releases["current"]["engine"] == "vllm"
    second = converge()
    assert second.returncode == 0, second.output[-4000:]
    assert second.changed == 0 and second.no_change == second.operations > 0, second.output[-4000:]
    # A no-op check reads the node in 2 commands (issue #19: at most 12): the recipe's planned
    # read, and the patched file's digests (its path is known from the first); drift one more,
    # which writes its verdict to the metrics textfile (issue #30).
    assert reads_of_a_noop("inventory/testbed.py", DEPLOY, HOST) == {"dry": 2, "drift": 3}


def test_venv_holds_the_pinned_real_wheels(bf16, th):
    host = th(HOST)
    versions = host.check_output(
        f'{VENV}/bin/python -c "import importlib.metadata as m; '
        f"print(m.version('torch'), m.version('vllm'))\""
    )
    assert versions == "2.11.0 0.24.0"
    cuda = host.check_output(
        f'{VENV}/bin/python -c "import runpy; '
        f"print(runpy.run_path('{site()}/torch/version.py')['cuda'])\""
    )
    assert cuda == "13.0"
    assert host.file(f"{VENV}/bin/vllm").exists


def test_qwen3_5_is_patched_with_its_orig(bf16, th):
    host = th(HOST)
    recorded = recorded_patch("0.24.0")
    assert sha256_on(host, qwen()) == recorded.patched_sha256
    assert sha256_on(host, f"{qwen()}.orig") == recorded.pristine_sha256
    shipped = wheel_member(vllm_wheel("0.24.0"), "vllm/model_executor/models/qwen3_5.py")
    assert hashlib.sha256(shipped).hexdigest() == recorded.pristine_sha256


def test_checkpoint_and_unit(bf16, th):
    host = th(HOST)
    model = model_dir(host)
    for name in (
        "config.json",
        "model.safetensors.index.json",
        "model.safetensors-00001-of-00002.safetensors",
    ):
        f = host.file(f"{model}/{name}")
        assert f.exists and f.user == "servefleet"
    unit = host.file(UNIT)
    assert unit.exists and unit.mode == 0o644 and unit.user == "root"
    text = unit.content_string
    standin = material.SPARK["vllm_executable"]
    for expected in (
        f"ExecStart={standin} serve {model}",
        f"--served-model-name {REPO}",
        "--language-model-only",
        "--max-model-len 4096",
        "--kv-cache-memory-bytes 2147483648",
        "--host 127.0.0.1",
        "--port 8000",
        'Environment="HF_HUB_OFFLINE=1"',
        f'Environment="VIRTUAL_ENV={VENV}"',
        "User=servefleet",
        "Restart=on-failure",
        "StandardOutput=journal",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "DevicePolicy=closed",
    ):
        assert expected in text, expected
    assert "EnvironmentFile" not in text  # no api_key_file by default
    # Only the executable differs from a real node: the flags are vLLM's, checked by the
    # stand-in against vLLM 0.24.0's own `vllm serve --help=all`.
    assert "--gdn-prefill-backend" not in text and "FLASHINFER" not in text
    assert host.file(standin).user == "root"
    service = host.service("servefleet-vllm")
    assert service.is_enabled and service.is_running
    for script in ("servefleet-health", "servefleet-evict-page-cache", "servefleet-fetch-model"):
        f = host.file(f"{ROOT}/bin/{script}")
        assert f.mode == 0o755 and f.user == "root", script


def test_lint_fails_this_host_when_the_recipe_would_not_load(bf16, th):
    unit_before = th(HOST).file(UNIT).content_string
    run = converge({"language_model_only": False})
    assert run.returncode != 0
    assert (
        "Qwen3_5MoeForConditionalGeneration builds a vision tower but the checkpoint has no "
        "visual weights"
    ) in run.output
    assert th(HOST).file(UNIT).content_string == unit_before  # stopped before the service step


def test_memory_preflight_fails_this_host_with_the_numbers(bf16, th):
    unit_before = th(HOST).file(UNIT).content_string
    run = converge({"kv_cache_memory_bytes": 64 << 20, "max_model_len": 262144})
    assert run.returncode != 0
    # The tiny checkpoint's config: 500 blocks of 270,336 bytes for one 262,144-token request.
    assert (
        "memory preflight failed on spark-1: vLLM would refuse to start: one 262,144-token "
        "request needs 0.13 GiB (135,168,000 bytes) of KV cache, the pool is 0.06 GiB "
        "(67,108,864 bytes); it holds at most 129,360 tokens per request"
    ) in run.output
    over = converge({"usable_memory_bytes": 5 * 1024**3})
    assert over.returncode != 0
    assert "weights 0.01 + KV pool 2.0 + overhead 4.0 = 6.01 GiB > 5.0 GiB usable" in over.output
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
    model = model_dir(host)
    host.run(f"rm {model}/model.safetensors-00002-of-00002.safetensors")
    run = converge({"page_cache_policy": "always"})
    assert run.returncode == 0, run.output[-3000:]
    report = json.loads(host.file(record).content_string)
    assert report["path"] == model and report["files"] >= 4
    assert report["evicted"] == report["resident_before"] - report["resident_after"]
    assert report["resident_after"] == 0
    # Global drop_caches only when asked: /proc/sys is read-only in these guests, so it fails,
    # named, and is not faked.
    host.run(f"rm {model}/model.safetensors-00002-of-00002.safetensors")
    dropped = converge({"page_cache_policy": "always", "page_cache_drop_global": True})
    assert dropped.returncode != 0
    assert "/proc/sys/vm/drop_caches" in dropped.output
    assert "failed" in json.loads(host.file(record).content_string)["drop_caches"]
    assert converge().returncode == 0


def test_api_key_protects_the_api_and_stays_out_of_argv(bf16, th, tmp_path):
    host = th(HOST)
    key = tmp_path / "api-key"
    key.write_text("sk-testbed-123456\n")
    run = converge({"api_key_file": str(key)})  # the health check passes with the key
    assert run.returncode == 0, run.output[-3000:]
    plain, env = host.file(f"{ROOT}/etc/api-key"), host.file(f"{ROOT}/etc/vllm.env")
    for f in (plain, env):
        assert f.mode == 0o600 and f.user == "root" and f.group == "root"
    assert plain.content_string == "sk-testbed-123456\n"  # the same shape for both engines
    assert env.content_string == "VLLM_API_KEY=sk-testbed-123456\n"
    text = host.file(UNIT).content_string
    assert f"EnvironmentFile={ROOT}/etc/vllm.env" in text and "sk-testbed" not in text
    url = "http://127.0.0.1:8000/v1/models"
    assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {url}") == "401"
    host.run("printf 'Authorization: Bearer sk-testbed-123456\\n' > /root/hdr")
    assert (
        host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' -H @/root/hdr {url}") == "200"
    )
    host.run("rm -f /root/hdr")
    assert "sk-testbed" not in run.output  # never in pyinfra's output
    back = converge()
    assert back.returncode == 0
    assert not host.file(f"{ROOT}/etc/api-key").exists
    assert not host.file(f"{ROOT}/etc/vllm.env").exists
    assert converge().changed == 0


def _standin_control(host, name: str, text: str | None) -> None:
    path = f"{STANDIN_CONTROL}/{name}"
    host.run(
        f"rm -f {path}"
        if text is None
        else f"mkdir -p {STANDIN_CONTROL} && printf '%s\\n' {shlex.quote(text)} > {path}"
    )


def test_kv_lines_that_differ_from_plan_kv_fail_the_host_naming_both(bf16, th):
    host = th(HOST)
    _standin_control(host, "replay-instead", "3000 1073741824")  # the other recorded run
    try:
        run = converge({"vllm_extra_args": '["--enforce-eager"]'})  # a changed unit: a restart
    finally:
        _standin_control(host, "replay-instead", None)
    assert run.returncode != 0
    assert (
        "vLLM logged GPU KV cache size 1,323,666 tokens, plan-kv expected 2,957,684" in run.output
    )
    assert "vLLM logged maximum concurrency 441.22x, plan-kv expected 722.09x" in run.output
    fixed = converge()
    assert fixed.returncode == 0, fixed.output[-3000:]
    assert host.service("servefleet-vllm").is_running


def test_a_crash_at_start_is_caught_within_restartsec_plus_20s_with_the_journal(bf16, th):
    host = th(HOST)
    _standin_control(host, "fail-versions", "0.24.0")
    try:
        run = converge({"vllm_extra_args": '["--enforce-eager"]'})
    finally:
        _standin_control(host, "fail-versions", None)
    assert run.returncode != 0
    assert "is crash-looping" in run.output
    assert "servefleet: the journal of servefleet-vllm.service" in run.output
    assert "simulated engine start failure" in run.output  # the journal's lines
    waited = [float(m) for m in re.findall(r'"waited_s": ([\d.]+)', run.output)]
    assert waited and waited[0] <= RESTART_SEC + 20, waited
    fixed = converge()
    assert fixed.returncode == 0, fixed.output[-3000:]
    assert host.service("servefleet-vllm").is_running


def test_patch_refusal_fails_only_that_host(bf16, th):
    """vllm_patch.apply on two hosts, one with a locally edited qwen3_5.py: that host fails
    with the hashes and the fix, untouched; the other is patched in the same run."""
    wheel = vllm_wheel("0.24.0")
    shipped = wheel_member(wheel, "vllm/model_executor/models/qwen3_5.py")
    metadata = wheel_member(wheel, "vllm-0.24.0.dist-info/METADATA")
    venv = "/tmp/sf-patch-venv"
    other = "rtx4090-1"
    for name in (HOST, other):
        host = th(name)
        where = site(name, venv)
        host.run(
            f"rm -rf {venv}; mkdir -p {where}/vllm/model_executor/models "
            f"{where}/vllm-0.24.0.dist-info {venv}/bin && ln -s /usr/bin/python3 {venv}/bin/python"
        )
        rec = load_state().hosts[name]
        for data, path in (
            (shipped, qwen(name, venv)),
            (metadata, f"{where}/vllm-0.24.0.dist-info/METADATA"),
        ):
            subprocess.run([*tb_hosts.ssh_args(rec), f"cat > {path}"], input=data, check=True)
    edited = qwen(HOST, venv)
    th(HOST).run(f"echo '# local edit' >> {edited}")
    edited_sha = sha256_on(th(HOST), edited)

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyinfra",
            "-y",
            "--limit",
            HOST,
            "--limit",
            other,
            "inventory/testbed.py",
            "servefleet.engines.vllm.operations.patch.apply",
            f"venv={venv}",
            "workdir=/opt/servefleet/bin",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )
    output = run.stdout + run.stderr

    assert run.returncode != 0
    assert f"servefleet: {HOST}: vLLM 0.24.0 in {venv}: the file has sha256 {edited_sha}" in output
    assert "pip install --force-reinstall --no-deps vllm==0.24.0" in output
    assert f"[{other}] Success" in output
    assert sha256_on(th(HOST), edited) == edited_sha
    assert not th(HOST).file(f"{edited}.orig").exists
    assert sha256_on(th(other), qwen(other, venv)) == recorded_patch("0.24.0").patched_sha256
    for name in (HOST, other):
        th(name).run(f"rm -rf {venv}")
