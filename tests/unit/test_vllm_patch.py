"""servefleet.engines.vllm.operations.patch on the real qwen3_5.py of vLLM 0.24.0 and 0.26.0.

Each test builds a fake venv from the real wheel (the file, and the real METADATA) and
drives the operation the way an operator would: `pyinfra @local ... venv=DIR -y`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.engines.vllm.operations.patch import PATCH_ROOT, recorded_patch

REPO_ROOT = Path(__file__).resolve().parents[2]
from servefleet_dev.testing.wheels import vllm_wheel, wheel_member  # noqa: E402

VERSIONS = ["0.24.0", "0.26.0"]
MODEL_FILE = "vllm/model_executor/models/qwen3_5.py"
GUARDED_CLASSES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
PYINFRA = shutil.which("pyinfra", path=str(Path(sys.executable).parent)) or "pyinfra"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_venv(root: Path, version: str, metadata_version: str | None = None) -> Path:
    """A venv layout holding vLLM's real qwen3_5.py and METADATA for `version`."""
    wheel = vllm_wheel(version)
    venv = root / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    target = site / MODEL_FILE
    target.parent.mkdir(parents=True)
    target.write_bytes(wheel_member(wheel, MODEL_FILE))
    metadata = wheel_member(wheel, f"vllm-{version}.dist-info/METADATA").decode()
    if metadata_version:  # pretend to be another release
        metadata = metadata.replace(f"Version: {version}\n", f"Version: {metadata_version}\n")
    dist_info = site / f"vllm-{metadata_version or version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(metadata)
    # The node-side applier runs with the venv's python.
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    return venv


def model_file(venv: Path) -> Path:
    return venv / "lib" / "python3.12" / "site-packages" / MODEL_FILE


def pyinfra(op: str, venv: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    """Run one vllm_patch operation on @local from the operator's project (files/ lives there);
    the applier and the patch go to a scratch workdir beside the venv."""
    workdir = [f"workdir={cwd / 'bin'}"] if op == "apply" else []
    (cwd / "bin").mkdir(exist_ok=True)
    return subprocess.run(
        [
            PYINFRA,
            "@local",
            f"servefleet.engines.vllm.operations.patch.{op}",
            f"venv={venv}",
            *workdir,
            *flags,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_json(op: str, venv: Path, cwd: Path) -> dict:
    """Run with -y --json and return pyinfra's results for the single operation."""
    done = pyinfra(op, venv, cwd, "-y", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["results"]["operations"][0]


def guard_in_init(tree: ast.Module, class_name: str) -> ast.If | None:
    """The `if ...language_model_only...: self.visual = None` in `class_name.__init__`."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    for node in ast.walk(init):
        if isinstance(node, ast.If) and "language_model_only" in ast.unparse(node.test):
            sets_none = any(
                isinstance(stmt, ast.Assign)
                and ast.unparse(stmt.targets[0]) == "self.visual"
                and isinstance(stmt.value, ast.Constant)
                and stmt.value.value is None
                for stmt in node.body
            )
            if sets_none:
                return node
    return None


@pytest.fixture(params=VERSIONS)
def version(request) -> str:
    return request.param


def test_recorded_pristine_hash_is_the_wheels_file(version):
    recorded = recorded_patch(version)
    shipped = wheel_member(vllm_wheel(version), MODEL_FILE)
    assert hashlib.sha256(shipped).hexdigest() == recorded.pristine_sha256


def test_patch_is_small(version):
    lines = recorded_patch(version).patch_file.read_text().splitlines()
    added = [ln for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    assert (len(added), len(removed)) == (5, 3)


def test_apply_patches_the_real_file(tmp_path, version):
    venv = make_venv(tmp_path, version)
    target = model_file(venv)
    recorded = recorded_patch(version)

    result = run_json("apply", venv, tmp_path)

    assert result["success"] == ["@local"]
    assert sha256(target) == recorded.patched_sha256
    assert sha256(target.with_name("qwen3_5.py.orig")) == recorded.pristine_sha256
    py_compile.compile(str(target), cfile=str(tmp_path / "q.pyc"), doraise=True)
    patched, pristine = (
        ast.parse(target.read_text()),
        ast.parse(target.with_name("qwen3_5.py.orig").read_text()),
    )
    for class_name in GUARDED_CLASSES:
        guard = guard_in_init(patched, class_name)
        assert guard is not None, f"no language_model_only guard in {class_name}.__init__"
        # Flag off: the original tower construction, unchanged.
        assert "Qwen3_VisionTransformer(" in ast.unparse(guard.orelse)
        assert guard_in_init(pristine, class_name) is None
    assert "['visual.'] if self.visual is None" in ast.unparse(patched)
    assert not list(tmp_path.glob("venv/**/*.servefleet-tmp"))


def test_second_apply_changes_nothing_and_keeps_orig(tmp_path, version):
    venv = make_venv(tmp_path, version)
    orig = model_file(venv).with_name("qwen3_5.py.orig")
    run_json("apply", venv, tmp_path)
    orig_stat = orig.stat()

    result = run_json("apply", venv, tmp_path)
    dry = pyinfra("apply", venv, tmp_path, "--dry", "--json")

    assert result["no_change"] == ["@local"] and result["success"] == []
    assert json.loads(dry.stdout.strip().splitlines()[-1])["plan"][0]["hosts_with_change"] == []
    assert sha256(orig) == recorded_patch(version).pristine_sha256
    assert orig.stat().st_mtime_ns == orig_stat.st_mtime_ns


def test_modified_file_is_refused_untouched(tmp_path, version):
    venv = make_venv(tmp_path, version)
    target = model_file(venv)
    with target.open("a") as handle:
        handle.write("# local edit\n")
    before = target.read_bytes()

    done = pyinfra("apply", venv, tmp_path, "-y")

    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert f"vLLM {version}" in output
    assert hashlib.sha256(before).hexdigest() in output
    assert f"pip install --force-reinstall --no-deps vllm=={version}" in output
    assert target.read_bytes() == before
    assert not target.with_name("qwen3_5.py.orig").exists()


def test_non_pristine_orig_stops_the_host(tmp_path, version):
    venv = make_venv(tmp_path, version)
    target = model_file(venv)
    orig = target.with_name("qwen3_5.py.orig")
    orig.write_text("# not vLLM's file\n")
    before = target.read_bytes()

    done = pyinfra("apply", venv, tmp_path, "-y")

    assert done.returncode == 1
    assert sha256(orig) in done.stdout + done.stderr
    assert target.read_bytes() == before
    assert orig.read_text() == "# not vLLM's file\n"


def test_revert_restores_the_pristine_file(tmp_path, version):
    venv = make_venv(tmp_path, version)
    target = model_file(venv)
    run_json("apply", venv, tmp_path)

    result = run_json("revert", venv, tmp_path)
    again = run_json("revert", venv, tmp_path)

    assert result["success"] == ["@local"]
    assert sha256(target) == recorded_patch(version).pristine_sha256
    assert not target.with_name("qwen3_5.py.orig").exists()
    assert again["no_change"] == ["@local"]


def test_unknown_version_is_refused_untouched(tmp_path):
    venv = make_venv(tmp_path, "0.24.0", metadata_version="0.25.0")
    target = model_file(venv)
    before = sha256(target)

    done = pyinfra("apply", venv, tmp_path, "-y")

    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert "vLLM 0.25.0" in output and before in output
    assert str(PATCH_ROOT / "0.25.0") in output
    assert sha256(target) == before
    assert not target.with_name("qwen3_5.py.orig").exists()


def test_refusal_fails_only_this_host_not_the_run(tmp_path):
    """A refusal is a failing command of this host (servefleet.operations.node.fail_host), not
    an exception while pyinfra prepares: the plan is still made (other hosts would go on) and
    only executing it fails the host, with the message."""
    venv = make_venv(tmp_path, "0.24.0", metadata_version="0.25.0")
    before = sha256(model_file(venv))

    dry = pyinfra("apply", venv, tmp_path, "--dry", "--json")
    done = pyinfra("apply", venv, tmp_path, "-y")

    assert dry.returncode == 0, dry.stdout + dry.stderr
    plan = json.loads(dry.stdout.strip().splitlines()[-1])["plan"][0]
    assert plan["hosts_with_change"] == ["@local"]
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert "[@local] servefleet: @local: vLLM 0.25.0" in output
    assert "[@local] Error: executed 0 commands" in output
    assert sha256(model_file(venv)) == before


def test_node_applier_writes_nothing_when_the_result_is_not_the_recorded_one(tmp_path):
    """The node-side script checks the patched hash before it writes anything."""
    venv = make_venv(tmp_path, "0.24.0")
    target = model_file(venv)
    recorded = recorded_patch("0.24.0")
    before = target.read_bytes()

    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / PATCH_ROOT / "apply_patch.py"),
            str(target),
            str(recorded.patch_file),
            recorded.pristine_sha256,
            "0" * 64,
        ],
        capture_output=True,
        text=True,
    )

    assert done.returncode == 5, done.stderr
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["qwen3_5.py"]
