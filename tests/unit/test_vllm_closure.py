"""The full dependency closure of the pinned torch + vLLM resolves to wheels on PyPI.

The testbed installs only the two real wheels (python_no_deps); this proves the rest: uv
resolves `torch==2.11.0` + `vllm==0.24.0` (the recipe's pins, group_data/vllm.py) against
PyPI for Ubuntu 24.04 (glibc 2.39, Python 3.12) on aarch64 (DGX Spark) and x86_64, binary
only, and every package of the lock is a wheel for that platform: nothing would build from
an sdist on a node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
PLATFORMS = {"aarch64": "aarch64-manylinux_2_39", "x86_64": "x86_64-manylinux_2_39"}
PYTHON = "3.12"  # Ubuntu 24.04's python3


def recipe_pins() -> dict[str, str]:
    """torch/vLLM pins as group_data/vllm.py sets them."""
    values: dict = {}
    exec((REPO_ROOT / "group_data" / "vllm.py").read_text(), values)
    return {"torch": values["torch_version"], "vllm": values["vllm_version"]}


def _python_fits(python: str, abi: str) -> bool:
    for tag in python.split("."):
        if tag == "cp312" or re.fullmatch(r"py3\d*", tag):  # py3, py37: pure Python
            return True
        match = re.fullmatch(r"cp3(\d+)", tag)
        if match and abi == "abi3" and int(match.group(1)) <= 12:
            return True
    return False


def wheel_fits(filename: str, arch: str) -> bool:
    """A wheel installable on manylinux <= 2.39 for `arch` and CPython 3.12."""
    python, abi, platforms = filename[: -len(".whl")].split("-")[-3:]
    if not _python_fits(python, abi):
        return False
    for plat in platforms.split("."):
        if plat == "any":
            return True
        match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", plat)
        if (
            match
            and match.group(3) == arch
            and (int(match.group(1)), int(match.group(2))) <= (2, 39)
        ):
            return True
        match = re.fullmatch(r"manylinux(?:2014|2010|1)_(\w+)", plat)
        if match and match.group(1) == arch:
            return True
    return False


@pytest.fixture(scope="module", params=sorted(PLATFORMS))
def lock(request, tmp_path_factory) -> tuple[str, dict]:
    if UV is None:
        pytest.skip("uv is not installed (pip install -e '.[test]')")
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"closure-{arch}")
    (tmp / "requirements.in").write_text("".join(f"{n}=={v}\n" for n, v in recipe_pins().items()))
    out = tmp / "pylock.toml"
    done = subprocess.run(
        [
            UV,
            "pip",
            "compile",
            str(tmp / "requirements.in"),
            "--no-config",
            "--quiet",
            "--index-url",
            "https://pypi.org/simple",
            "--only-binary",
            ":all:",
            "--python-platform",
            PLATFORMS[arch],
            "--python-version",
            PYTHON,
            "--format",
            "pylock.toml",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        # The system CA store: the machine may sit behind an intercepting proxy.
        env={**os.environ, "UV_SYSTEM_CERTS": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return arch, tomllib.loads(out.read_text())


def test_pins_resolve_with_the_full_closure(lock):
    _, data = lock
    versions = {p["name"]: p["version"] for p in data["packages"]}
    pins = recipe_pins()
    assert versions["torch"] == pins["torch"] == "2.11.0"
    assert versions["vllm"] == pins["vllm"] == "0.24.0"
    # The closure measured on 2026-11-29: 194 packages, ~4.3 GB of wheels.
    assert len(versions) > 150


def test_every_package_is_a_wheel_for_the_platform(lock):
    arch, data = lock
    no_wheel = []
    for package in data["packages"]:
        assert "sdist" not in package, f"{package['name']} would build from an sdist"
        names = [w["url"].rsplit("/", 1)[1] for w in package.get("wheels", [])]
        if not any(wheel_fits(n, arch) for n in names):
            no_wheel.append((package["name"], names))
    assert no_wheel == []
    torch = next(p for p in data["packages"] if p["name"] == "torch")
    assert any(f"manylinux_2_28_{arch}" in w["url"] for w in torch["wheels"])
