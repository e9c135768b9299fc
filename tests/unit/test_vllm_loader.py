"""Prove it loads, with vLLM's own loader: real vLLM 0.24.0 on CPU, tiny Qwen3.5-MoE.

A cached venv holds the real wheel and its dependency closure (built once, several GB);
servefleet/testing/vllm_loader_probe.py runs in it and reports one JSON line per load.
The patch goes in and out through the pyinfra operation itself, on that venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import servefleet_dev.testing
from servefleet.engines.vllm.operations.patch import recorded_patch
from servefleet_dev.testing.wheels import cache_lock, vllm_venv

VERSION = "0.24.0"  # 0.26.0 does not construct on CPU: its activations need CUDA-only ops
PROBE = Path(servefleet_dev.testing.__file__).parent / "vllm_loader_probe.py"
PYINFRA = shutil.which("pyinfra", path=str(Path(sys.executable).parent)) or "pyinfra"
MISSING_VISUAL = "ValueError: Following weights were not initialized from checkpoint: {'visual."


def probe(venv: Path, cwd: Path, *args: str) -> dict:
    """Run the probe in the loader venv (-I: nothing from this repo on its path)."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-I", str(PROBE), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_patch(op: str, venv: Path, cwd: Path) -> None:
    # From the project, as an operator's pyinfra runs (files/ resolves there); `apply` uploads its
    # applier and the patch into a root-owned work directory (servefleet's bin/ on a node).
    args = [f"venv={venv}"] + ([f"workdir={cwd}"] if op == "apply" else [])
    done = subprocess.run(
        [PYINFRA, "@local", f"servefleet.engines.vllm.operations.patch.{op}", *args, "-y"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def model_file_sha256(venv: Path) -> str:
    (path,) = venv.glob("lib/python3.*/site-packages/vllm/model_executor/models/qwen3_5.py")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-loader")


@pytest.fixture(scope="module")
def venv(work) -> Path:
    """The loader venv, held for this module: other runs on this machine wait."""
    path = vllm_venv(VERSION)
    with cache_lock(path.name):
        vllm_patch("revert", path, work)  # a killed run may have left it patched
        yield path
        vllm_patch("revert", path, work)


@pytest.fixture(scope="module")
def text_only(venv, work) -> Path:
    """Like Qwen-AgentWorld: the multimodal architecture, no visual.* tensors."""
    probe(venv, work, "make-checkpoint", str(work / "text-only"))
    return work / "text-only"


@pytest.fixture(scope="module")
def with_visual(venv, work) -> Path:
    probe(venv, work, "make-checkpoint", str(work / "with-visual"), "--keep-visual")
    return work / "with-visual"


@pytest.fixture
def stock(venv, work) -> Path:
    vllm_patch("revert", venv, work)
    assert model_file_sha256(venv) == recorded_patch(VERSION).pristine_sha256
    return venv


@pytest.fixture
def patched(venv, work):
    vllm_patch("apply", venv, work)
    assert model_file_sha256(venv) == recorded_patch(VERSION).patched_sha256
    yield venv
    vllm_patch("revert", venv, work)


def test_stock_without_flag_fails_on_missing_visual_weights(stock, text_only, work):
    result = probe(stock, work, "load", str(text_only))
    assert result["ok"] is False
    assert result["error"].startswith(MISSING_VISUAL)


def test_stock_with_flag_loads_with_a_placeholder_tower(stock, text_only, work):
    result = probe(stock, work, "load", str(text_only), "--language-model-only")
    assert result["ok"] is True
    assert result["visual"] == "StageMissingLayer"
    assert result["qwen3_5_sha256"] == recorded_patch(VERSION).pristine_sha256


def test_patched_with_flag_builds_no_tower(patched, text_only, work):
    result = probe(patched, work, "load", str(text_only), "--language-model-only")
    assert result["ok"] is True
    assert result["model"] == "Qwen3_5MoeForConditionalGeneration"
    assert result["visual"] is None
    assert result["qwen3_5_sha256"] == recorded_patch(VERSION).patched_sha256


def test_patched_without_flag_behaves_as_stock(patched, text_only, work):
    result = probe(patched, work, "load", str(text_only))
    assert result["ok"] is False
    assert result["error"].startswith(MISSING_VISUAL)


def test_patched_with_flag_skips_visual_weights_in_the_checkpoint(patched, with_visual, work):
    # Without "visual." in skip_prefixes this raises "There is no module or parameter
    # named 'visual'": the tower is None but the checkpoint has its weights.
    result = probe(patched, work, "load", str(with_visual), "--language-model-only")
    assert result["ok"] is True
    assert result["visual"] is None
