"""The BF16 vLLM recipe's logic (servefleet/vllm.py), its node-side scripts and its checks.

Pure functions directly; the operations through `pyinfra @local`, as an operator would run
them; files/vllm/health.py against a local fake of vLLM's API.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from servefleet.core import python_env
from servefleet.core.errors import DataError
from servefleet.core.layout import NodeLayout
from servefleet.core.systemd import exec_line
from servefleet.engines.vllm import logic as vllm, steps as recipe
from servefleet.engines.vllm.facts import SafetensorsBytes
from servefleet.engines.vllm.logic import kvplan
from servefleet.facts.pyenv import DistVersions, TorchCuda
from servefleet.fleet.data import HostData, Layer, validate
from servefleet.recipes import serving
from servefleet.recipes.service import render_unit as render_template
from servefleet_dev.testing.tiny_models import AGENTWORLD_CONFIG, build_tiny_checkpoint

MODEL = "/opt/servefleet/models/Qwen--Qwen-AgentWorld-35B-A3B/" + "0" * 40
REPO_ROOT = Path(__file__).resolve().parents[2]

PYINFRA = shutil.which("pyinfra", path=str(Path(sys.executable).parent)) or "pyinfra"
GiB = 1 << 30


def group_data(*names: str) -> dict:
    """group_data/all.py then the named role files, later wins (as pyinfra applies them)."""
    data: dict = {}
    for name in ("all", *names):
        values: dict = {}
        exec((REPO_ROOT / "group_data" / f"{name}.py").read_text(), values)
        data.update({k: v for k, v in values.items() if not k.startswith("__")})
    return data


@pytest.fixture
def spark() -> dict:
    return group_data("spark", "vllm")


def load_script(relative: str):
    path = REPO_ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- data --------------------------------------------------------------------------------------


@pytest.mark.parametrize("roles", [("spark", "vllm"), ("spark", "vllm", "testbed_vllm", "testbed")])
def test_recipe_defaults_pass_the_contract(roles):
    data = group_data(*roles)
    host = HostData("spark-x", list(roles), [Layer("group_data", data)])
    valid = validate(host, "serve_bf16")  # raises DataError on a bad default
    # The recipe runs from the data as shipped: nothing dropped or rewritten, pins as written.
    assert valid == data
    assert vllm.venv_path(valid).endswith(f"/venvs/vllm-{data['vllm_version']}")


def test_bad_values_are_named():
    data = {**group_data("spark"), "page_cache_policy": "sometimes", "max_model_len": "262144"}
    with pytest.raises(DataError) as err:
        validate(HostData("spark-x", ["spark"], [Layer("group_data/spark.py", data)]), "serve_bf16")
    assert "'page_cache_policy' = 'sometimes'" in str(err.value)
    assert "'max_model_len' = '262144' (str)" in str(err.value)


def test_paths(spark):
    assert vllm.venv_path(spark) == "/opt/servefleet/venvs/vllm-0.24.0"
    assert vllm.venv_path({**spark, "vllm_version": "0.26.0"}).endswith("/venvs/vllm-0.26.0")
    # One directory per repo and commit (the previous release's model stays servable).
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert (
        NodeLayout.of(spark).model_dir(spark["model_repo"], sha)
        == f"/opt/servefleet/models/Qwen--Qwen-AgentWorld-35B-A3B/{sha}"
    )
    moved = {**spark, "servefleet_root": "/srv/sf", "models_root": "/data/models"}
    assert vllm.venv_path(moved) == "/srv/sf/venvs/vllm-0.24.0"
    assert (
        NodeLayout.of(moved).model_dir(spark["model_repo"], sha)
        == f"/data/models/Qwen--Qwen-AgentWorld-35B-A3B/{sha}"
    )


# --- versions ----------------------------------------------------------------------------------

PINS = {"torch": "2.11.0", "vllm": "0.24.0"}
VENV = "/opt/servefleet/venvs/vllm-0.24.0"


def test_versions_as_pinned_pass():
    found = {"torch": "2.11.0", "vllm": "0.24.0"}
    assert python_env.versions_match(found, PINS)
    assert python_env.version_problems(found, PINS, "13.0", "13.0", VENV) == []
    # A local label (the PyTorch index's 2.11.0+cu130) satisfies the pin, as pip says.
    assert (
        python_env.version_problems({**found, "torch": "2.11.0+cu130"}, PINS, "13.0", "13.0", VENV)
        == []
    )


def test_version_mismatch_names_both_values():
    problems = python_env.version_problems(
        {"torch": "2.10.0", "vllm": "0.24.0"}, PINS, "13.0", "13.0", VENV
    )
    assert problems == [f"torch 2.10.0 is installed in {VENV}, the pin is torch==2.11.0"]
    assert not python_env.versions_match({"torch": "2.10.0", "vllm": "0.24.0"}, PINS)
    problems = python_env.version_problems({"torch": "2.11.0"}, PINS, "13.0", "13.0", VENV)
    assert problems == [f"vllm is not installed in {VENV} (pinned vllm==0.24.0)"]


def test_cuda_mismatch_names_both_values():
    problems = python_env.version_problems(PINS, PINS, "12.8", "13.0", VENV)
    assert len(problems) == 1
    assert "torch.version.cuda is 12.8" in problems[0] and "needs CUDA 13.0" in problems[0]
    assert "cu130" in problems[0]
    cpu = python_env.version_problems(PINS, PINS, "", "13.0", VENV)
    assert "None (a CPU build)" in cpu[0]


def test_version_facts_parse_their_output():
    lines = ["name=torch", "version=2.11.0", "name=vllm", "version=0.24.0"]
    assert DistVersions().process(lines) == {"torch": "2.11.0", "vllm": "0.24.0"}
    assert DistVersions.default() == {}
    assert TorchCuda().process(["cuda=13.0"]) == "13.0"
    assert TorchCuda().process(["cuda="]) == ""
    assert SafetensorsBytes().process(["100", "23"]) == 123


def test_torch_cuda_fact_reads_the_real_version_py(tmp_path):
    """The fact's command on a venv holding torch 2.11.0's real torch/version.py."""
    from servefleet_dev.testbed.material import torch_wheel
    from servefleet_dev.testing.wheels import wheel_member

    # PyPI's torch 2.11.0 wheel, the testbed's: from the cache, downloaded once when missing.
    wheel = torch_wheel(f"{sys.version_info[0]}.{sys.version_info[1]}")  # the venv's python
    site = tmp_path / f"venv/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch/version.py").write_bytes(wheel_member(wheel, "torch/version.py"))
    (tmp_path / "venv/bin").mkdir()
    (tmp_path / "venv/bin/python").symlink_to(sys.executable)
    command = TorchCuda().command(str(tmp_path / "venv")).get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert TorchCuda().process(out.stdout.splitlines()) == "13.0"


# --- service -----------------------------------------------------------------------------------


def test_serve_args_are_the_recipe(spark):
    args = vllm.serve_args(spark, "/opt/servefleet/models/Qwen--Qwen-AgentWorld-35B-A3B")
    line = " ".join(args)
    assert args[:2] == ["serve", "/opt/servefleet/models/Qwen--Qwen-AgentWorld-35B-A3B"]
    for part in (
        "--served-model-name Qwen/Qwen-AgentWorld-35B-A3B",
        "--language-model-only",
        "--max-model-len 262144",
        "--kv-cache-memory-bytes 8589934592",
        "--host 127.0.0.1",
        "--port 8000",
        "--dtype bfloat16",
    ):
        assert part in line
    auto = vllm.serve_args(
        {
            **spark,
            "kv_cache_memory_bytes": None,
            "language_model_only": False,
            "vllm_extra_args": ["--gpu-memory-utilization", "0.85"],
        },
        "/m",
    )
    assert "--kv-cache-memory-bytes" not in auto and "--language-model-only" not in auto
    assert auto[-2:] == ["--gpu-memory-utilization", "0.85"]
    # Remote code (the repo's own Python, run as the engine) only when the data turns it on.
    assert "--trust-remote-code" not in args and spark["trust_remote_code"] is False
    assert "--trust-remote-code" in vllm.serve_args({**spark, "trust_remote_code": True}, "/m")


def test_exec_line_quotes_for_systemd():
    line = exec_line(["/v/bin/vllm", "serve", "/m", "--served-model-name", "a b%c$HOME"])
    assert line == '/v/bin/vllm serve /m \\\n    --served-model-name "a b%%c$$HOME"'


@pytest.mark.parametrize("key", [None, "/tmp/api-key"])
def test_unit_template(spark, key, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # templates and their includes resolve against the project
    unit = render_template(
        recipe.UNIT_TEMPLATE, vllm.unit_context({**spark, "api_key_file": key}, MODEL)
    )
    lines = unit.splitlines()
    for expected in (
        "User=servefleet",
        'Environment="HF_HUB_OFFLINE=1"',
        "Restart=on-failure",
        "StandardOutput=journal",
        "StandardError=journal",
        "ProtectSystem=strict",
        "ReadWritePaths=/opt/servefleet/cache /opt/servefleet/models",
        # The secrets and root's records: not even readable by the engine.
        "InaccessiblePaths=-/opt/servefleet/etc -/opt/servefleet/state",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "DevicePolicy=closed",
        "WantedBy=multi-user.target",
    ):
        assert expected in lines, expected
    assert ("EnvironmentFile=/opt/servefleet/etc/vllm.env" in lines) == bool(key)
    assert "--language-model-only \\" in unit and "--kv-cache-memory-bytes 8589934592" in unit
    assert (
        "MemoryDenyWriteExecute=yes" in lines
    )  # served on the H200 under it (fixtures/h200/sandbox)
    # GPU nodes: the NVIDIA devices, and only them, behind DevicePolicy=closed.
    assert ("DeviceAllow=char-nvidia rw" in lines) is True
    cpu = render_template(
        recipe.UNIT_TEMPLATE, vllm.unit_context({**spark, "require_gpu": False}, MODEL)
    )
    assert "DeviceAllow" not in cpu
    service = unit.split("[Service]")[1].split("[Install]")[0]
    assert "\n\n" not in service.strip()


def test_page_cache_policy():
    assert vllm.page_cache_applies({"page_cache_policy": "auto", "kv_cache_memory_bytes": None})
    assert not vllm.page_cache_applies(
        {"page_cache_policy": "auto", "kv_cache_memory_bytes": 8 * GiB}
    )
    assert vllm.page_cache_applies(
        {"page_cache_policy": "always", "kv_cache_memory_bytes": 8 * GiB}
    )
    assert not vllm.page_cache_applies(
        {"page_cache_policy": "never", "kv_cache_memory_bytes": None}
    )


# --- memory preflight --------------------------------------------------------------------------

WEIGHTS = 67 * GiB  # ~35B parameters in BF16


def test_the_recipe_fits_a_spark(spark):
    verdict = vllm.memory_verdict(
        AGENTWORLD_CONFIG, WEIGHTS, kvplan.SPARK_USABLE_MEMORY_BYTES, spark
    )
    assert verdict.problems == []
    # The numbers vLLM 0.24.0 logs for this model (tests/unit/test_kvplan.py derives them).
    assert (verdict.plan.tokens, f"{verdict.plan.max_concurrency:.2f}") == (412_980, "1.58")
    assert "GPU KV cache size 412,980 tokens" in verdict.summary()


def test_a_pool_too_small_for_max_model_len_is_refused_with_numbers(spark):
    data = {**spark, "kv_cache_memory_bytes": 4 * GiB}
    verdict = vllm.memory_verdict(
        AGENTWORLD_CONFIG, WEIGHTS, kvplan.SPARK_USABLE_MEMORY_BYTES, data
    )
    (problem,) = verdict.problems
    # One 262,144-token request needs 252 blocks of 21,626,880 bytes = 5,449,973,760 bytes.
    assert "needs 5.08 GiB (5,449,973,760 bytes)" in problem
    assert "the pool is 4.0 GiB (4,294,967,296 bytes)" in problem
    # vLLM's own hint: (4 GiB // 21,626,880 = 198 blocks) - 3 state blocks = 195 * 1,056 tokens
    assert "it holds at most 205,920 tokens per request" in problem


def test_over_budget_is_refused_with_numbers(spark):
    verdict = vllm.memory_verdict(AGENTWORLD_CONFIG, WEIGHTS, 64 * GiB, spark)
    (problem,) = verdict.problems
    assert problem.startswith(
        "weights 67.0 + KV pool 8.0 + overhead 4.0 = 79.0 GiB > 64.0 GiB usable"
    )


def test_auto_sized_pool_is_planned_from_what_is_left(spark):
    data = {**spark, "kv_cache_memory_bytes": None}
    verdict = vllm.memory_verdict(AGENTWORLD_CONFIG, WEIGHTS, 114 * GiB, data)
    assert verdict.pool_source == "estimate" and verdict.problems == []
    assert verdict.plan.kv_cache_memory_bytes == (114 - 67 - 4) * GiB
    short = vllm.memory_verdict(AGENTWORLD_CONFIG, WEIGHTS, 72 * GiB, data)
    assert short.problems and "vLLM would refuse to start" in short.problems[0]


# --- operations on @local ----------------------------------------------------------------------


def run_op(op: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYINFRA, "@local", f"servefleet.engines.vllm.operations.preflight.{op}", *args, "-y"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", visual=False, mtp=False)


def test_lint_fails_the_host_whose_recipe_would_not_load(tiny, tmp_path):
    # As root here: on a node, the service user (who owns the models root).
    ok = run_op(
        "checkpoint_lint", tmp_path, f"path={tiny}", "language_model_only=True", "user=root"
    )
    bad = run_op(
        "checkpoint_lint", tmp_path, f"path={tiny}", "language_model_only=False", "user=root"
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert bad.returncode == 1
    out = bad.stdout + bad.stderr
    assert "servefleet: checkpoint" in out and "0 visual" in out
    assert (
        "Qwen3_5MoeForConditionalGeneration builds a vision tower but the checkpoint has no "
        "visual weights"
    ) in out


def test_memory_preflight_fails_the_host_with_numbers(tiny, tmp_path, spark):
    data = {k: spark[k] for k in ("max_model_len", "kv_block_alignment", "memory_overhead_bytes")}
    good = {**data, "kv_cache_memory_bytes": 8 * GiB, "usable_memory_bytes": 64 * GiB}
    small = {**good, "kv_cache_memory_bytes": 64 << 20}
    ok = run_op(
        "memory_preflight", tmp_path, f"path={tiny}", f"data={json.dumps(good)}", "user=root"
    )
    bad = run_op(
        "memory_preflight", tmp_path, f"path={tiny}", f"data={json.dumps(small)}", "user=root"
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert bad.returncode == 1
    # The tiny checkpoint's config: block size 528, 500 blocks of 270,336 bytes per request.
    assert (
        "needs 0.13 GiB (135,168,000 bytes) of KV cache, the pool is 0.06 GiB (67,108,864 "
        "bytes); it holds at most 129,360 tokens per request" in bad.stdout + bad.stderr
    )


# --- node-side scripts -------------------------------------------------------------------------


def test_evict_reports_bytes_evicted(tmp_path):
    tree = tmp_path / "model"
    tree.mkdir()
    (tree / "a.safetensors").write_bytes(b"\1" * (4 << 20))
    (tree / "link.safetensors").symlink_to(tree / "a.safetensors")  # counted once
    (tree / "a.safetensors").read_bytes()
    record = tmp_path / "evict.json"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / recipe.EVICT_SCRIPT), str(tree), "--record", str(record)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report == json.loads(record.read_text())
    assert (report["files"], report["bytes"]) == (1, 4 << 20)
    assert report["resident_after"] == 0
    assert report["evicted"] == report["resident_before"] > 0
    again = json.loads(
        subprocess.run(
            [sys.executable, str(REPO_ROOT / recipe.EVICT_SCRIPT), str(tree)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert again["evicted"] == 0


def test_evict_refuses_a_missing_directory(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / recipe.EVICT_SCRIPT), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "is not a directory" in done.stderr


VLLM_LOG = """\
(EngineCore pid=123) INFO 11-29 12:00:01 [kv_cache_utils.py:2146] GPU KV cache size: 412,980 tokens
(EngineCore pid=123) INFO 11-29 12:00:01 [kv_cache_utils.py:2147] Maximum concurrency for 262,144 tokens per request: 1.58x
"""


def test_health_parses_the_engine_log():
    health = load_script("files/health/health.py")
    seen = health.parse_engine_log(VLLM_LOG.splitlines())
    assert seen == {"tokens": 412_980, "max_model_len": 262_144, "concurrency": "1.58"}
    assert health.compare(seen, 412_980, "1.58", 262_144) == []
    problems = health.compare(seen, 416_727, "1.59", 262_144)
    assert problems == [
        "vLLM logged GPU KV cache size 412,980 tokens, plan-kv expected 416,727",
        "vLLM logged maximum concurrency 1.58x, plan-kv expected 1.59x",
    ]
    assert health.compare({}, 1, "1.00")[0].startswith("the engine log of this start has no")
    assert health.compare({}, None, None) == []


class FakeVllm(http.server.BaseHTTPRequestHandler):
    key = "s3cret"

    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            return self._send(401, {"error": "Unauthorized"})
        self._send(
            200,
            {
                "model": body["model"],
                "choices": [{"message": {"role": "assistant", "content": "Hello"}}],
            },
        )


@pytest.fixture
def fake_vllm():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_health_script_end_to_end(fake_vllm, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(VLLM_LOG)
    key = tmp_path / "api-key"
    key.write_text("s3cret\n")  # the plain key file both engines use
    base = [
        sys.executable,
        str(REPO_ROOT / serving.HEALTH_SCRIPT),
        "--url",
        fake_vllm,
        "--model",
        "m",
        "--timeout",
        "5",
        "--log-file",
        str(log),
        "--key-file",
        str(key),
    ]

    ok = subprocess.run(
        [
            *base,
            "--expect-tokens",
            "412980",
            "--expect-concurrency",
            "1.58",
            "--max-model-len",
            "262144",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["chat"] == "Hello"

    off = subprocess.run(
        [*base, "--expect-tokens", "400000", "--expect-concurrency", "1.58"],
        capture_output=True,
        text=True,
    )
    assert off.returncode == 1
    assert "vLLM logged GPU KV cache size 412,980 tokens, plan-kv expected 400,000" in off.stderr

    key.write_text("wrong\n")
    denied = subprocess.run(base, capture_output=True, text=True)
    assert denied.returncode == 1 and "chat completion: HTTP 401" in denied.stderr


def test_health_gives_up_after_its_timeout():
    health = load_script("files/health/health.py")
    clock = iter(range(0, 100, 5))
    problem = health.wait_healthy(
        "http://127.0.0.1:9", health.Unit(""), 10, sleep=lambda s: None, now=lambda: next(clock)
    )
    assert problem.startswith("no healthy /health at http://127.0.0.1:9 after 10 s")


# --- the pinned install, read back after it ran ------------------------------------------------


def fake_uv(tmp_path: Path, venv: Path, torch: str, cuda: str) -> Path:
    """A stand-in for uv that 'installs' torch/vLLM dist-info (and torch/version.py) into venv."""
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    script = tmp_path / "uv"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {tmp_path}/uv.log
mkdir -p {site}/torch {site}/torch-{torch}.dist-info {site}/vllm-0.24.0.dist-info
printf 'Metadata-Version: 2.4\\nName: torch\\nVersion: {torch}\\n\\nVersion: 9\\n' > {site}/torch-{torch}.dist-info/METADATA
printf 'Metadata-Version: 2.4\\nName: vllm\\nVersion: 0.24.0\\n' > {site}/vllm-0.24.0.dist-info/METADATA
printf "cuda = '{cuda}'\\n" > {site}/torch/version.py
""")
    script.chmod(0o755)
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    if not (venv / "bin" / "python").exists():
        (venv / "bin" / "python").symlink_to(sys.executable)
    return script


def install(tmp_path: Path, venv: Path, uv: Path, data: dict) -> subprocess.CompletedProcess:
    sources = [a for link in data.get("pip_find_links", []) for a in ("--find-links", link)]
    return subprocess.run(
        [
            PYINFRA,
            "@local",
            "servefleet.operations.pyenv.packages",
            f"venv={venv}",
            f"uv={uv}",
            f"pins={json.dumps(PINS)}",
            'torch_cuda="13.0"',
            f"sources={json.dumps(sources)}",
            f"no_deps={json.dumps(bool(data.get('python_no_deps')))}",
            "-y",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_install_then_read_back_then_nothing_to_do(tmp_path):
    venv = tmp_path / "venv"
    uv = fake_uv(tmp_path, venv, "2.11.0", "13.0")
    data = {"pip_find_links": ["/wheels"], "python_no_deps": True}
    first = install(tmp_path, venv, uv, data)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "uv.log").read_text().split() == [
        "pip",
        "install",
        "--quiet",
        "--python",
        f"{venv}/bin/python",
        "--find-links",
        "/wheels",
        "--no-deps",
        "torch==2.11.0",
        "vllm==0.24.0",
    ]
    again = install(tmp_path, venv, uv, data)
    assert again.returncode == 0 and "[@local] No changes" in again.stdout + again.stderr
    assert len((tmp_path / "uv.log").read_text().splitlines()) == 1  # not installed twice


def test_a_wrong_version_after_install_fails_the_host_with_both_values(tmp_path):
    venv = tmp_path / "venv"
    uv = fake_uv(tmp_path, venv, "2.10.0", "13.0")  # the source serves another torch
    done = install(tmp_path, venv, uv, {})
    assert done.returncode == 1
    assert (
        f"servefleet: @local: after installing, torch 2.10.0 is installed in {venv}, the pin "
        f"is torch==2.11.0"
    ) in done.stdout + done.stderr


def test_a_cpu_torch_fails_the_host_without_reinstalling(tmp_path):
    venv = tmp_path / "venv"
    uv = fake_uv(tmp_path, venv, "2.11.0", "")  # e.g. torch from the CPU index: cuda None
    first = install(tmp_path, venv, uv, {})
    again = install(tmp_path, venv, uv, {})
    for run in (first, again):
        assert run.returncode == 1
        assert "torch.version.cuda is None (a CPU build)" in run.stdout + run.stderr
    assert len((tmp_path / "uv.log").read_text().splitlines()) == 1
