"""Real vLLM wheels from PyPI for tests, downloaded once into the servefleet cache.

wheel = vllm_wheel("0.24.0")   # cache/wheels/vllm-0.24.0-cp38-abi3-...whl
source = wheel_member(wheel, "vllm/model_executor/models/qwen3_5.py")
venv = vllm_venv("0.24.0")     # cache/venvs/vllm-0.24.0-cpu-loader
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servefleet.core.paths import cache_subdir

# Extra packages of the loader venv; transformers makes the tiny checkpoints (5.17.0 is
# the version the loader check was first done with).
LOADER_EXTRAS = ("transformers==5.17.0",)


def vllm_wheel(version: str, machine: str = "x86_64") -> Path:
    """The vllm==`version` wheel for `machine` (`uname -m`: x86_64, aarch64; manylinux),
    downloaded with pip if not cached."""
    wheels = cache_subdir("wheels")
    pattern = f"vllm-{version}-*_{machine}.whl"
    with cache_lock(f"vllm-{version}-{machine}-wheel"):
        found = sorted(wheels.glob(pattern))
        if not found:
            # --no-deps: only this wheel (~300 MB), not torch and friends.
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--platform",
                    f"manylinux_2_28_{machine}",
                    "--dest",
                    str(wheels),
                    f"vllm=={version}",
                ],
                check=True,
            )
            found = sorted(wheels.glob(pattern))
    if not found:
        raise FileNotFoundError(f"pip downloaded no vllm-{version} {machine} wheel into {wheels}")
    return found[-1]


def wheel_member(wheel: Path, member: str) -> bytes:
    """The bytes of one file inside a wheel, without unpacking the rest."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member)


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock named `name` in the cache, waiting for it if taken.

    Test runs on one machine share the cache: one builds (or patches) a venv at a time.
    """
    with open(cache_subdir("locks") / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _uv() -> str | None:
    """uv beside this interpreter (servefleet's test extra) or on PATH."""
    return shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def vllm_venv(version: str, extras: tuple[str, ...] = LOADER_EXTRAS) -> Path:
    """A cached venv with the real vllm==`version` wheel and its full dependency closure.

    Built once (torch 2.11.0 from PyPI is a CUDA build: several GB) under
    cache/venvs/vllm-<version>-cpu-loader; a file recording the recipe marks it complete,
    so an interrupted build is redone and a changed recipe rebuilds it.
    """
    wheel = vllm_wheel(version)
    venv = cache_subdir("venvs") / f"vllm-{version}-cpu-loader"
    with cache_lock(venv.name):
        _build_venv(venv, wheel, extras)
    return venv


def _build_venv(venv: Path, wheel: Path, extras: tuple[str, ...]) -> None:
    marker = venv / "servefleet-recipe.json"
    recipe = {"wheel": wheel.name, "extras": list(extras), "python": sys.version.split()[0]}
    if marker.is_file() and json.loads(marker.read_text()).get("recipe") == recipe:
        return

    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    uv = _uv()
    python = venv / "bin" / "python"
    # The machine may sit behind an intercepting proxy whose CA only the system store has.
    env = {**os.environ, "UV_NATIVE_TLS": "1"}
    if uv:
        subprocess.run(
            [uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env
        )
        install = [uv, "pip", "install", "--quiet", "--python", str(python)]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        install = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*install, str(wheel), *extras], check=True, env=env)
    marker.write_text(
        json.dumps({"recipe": recipe, "build_seconds": round(time.monotonic() - started)}) + "\n"
    )
