"""Python environments on a node: a venv, and pinned packages read back from its dist-info.

Both operations are no-ops when the node is already as data says, so a converge with nothing
to do yields no command, and neither starts a Python interpreter to find out: versions come
from `*.dist-info/METADATA` (facts.pyenv.DistVersions), torch.version.cuda from torch/version.py.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pyinfra import host
from pyinfra.api import operation

from servefleet.core.python_env import version_problems, versions_match
from servefleet.facts import batch
from servefleet.facts.node import PathStat
from servefleet.facts.pyenv import DistVersions, TorchCuda
from servefleet.operations.node import fail_host


def _env_prefix(env: dict | None) -> str:
    if not env:
        return ""
    return "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " "


@operation()
def venv(path: str, python: str = "python3", uv: str | None = None, env: dict | None = None):
    """
    Create a virtualenv unless one is there (its ``pyvenv.cfg``): with uv when given, else with
    ``python -m venv``.

    + path: the venv directory
    + python: interpreter the venv is made from (name on PATH or a path)
    + uv: the uv binary (servefleet's tools venv has one), or None
    + env: extra environment of the command

    **Example:**

    .. code:: python

        pyenv.venv(path="/opt/servefleet/venvs/vllm-0.24.0",
                   uv="/opt/servefleet/tools/venv/bin/uv", python="python3")
    """
    if batch.get(host, PathStat, path=f"{path.rstrip('/')}/pyvenv.cfg"):
        host.noop(f"venv {path} exists")
        return
    if uv:
        yield (
            f"{_env_prefix(env)}{shlex.quote(uv)} venv --quiet --python {shlex.quote(python)} "
            f"{shlex.quote(path)}"
        )
    else:
        yield f"{_env_prefix(env)}{shlex.quote(python)} -m venv {shlex.quote(path)}"
    batch.forget(host)


def _problems(venv: str, pins: dict, torch_cuda: str | None) -> list[str]:
    found = batch.get(host, DistVersions, venv=venv, names=tuple(pins))
    cuda = batch.get(host, TorchCuda, venv=venv) if torch_cuda and "torch" in found else None
    return version_problems(found, pins, cuda, torch_cuda, venv)


@operation()
def packages(
    venv: str,
    pins: dict,
    sources: Sequence[str] = (),
    no_deps: bool = False,
    uv: str | None = None,
    torch_cuda: str | None = None,
    env: dict | None = None,
    compile_bytecode: bool = False,
):
    """
    Install pinned packages into a venv when the installed versions differ, then read the
    versions back and fail this host, naming both values, if they are not the pins.

    + venv: the venv directory
    + pins: ``{distribution: version}``, e.g. ``{"torch": "2.11.0", "vllm": "0.24.0"}``
    + sources: index / find-links arguments (servefleet.core.python_env.source_args)
    + no_deps: install only the pinned wheels (a wheelhouse that holds the closure already)
    + uv: install with this uv binary (else the venv's pip)
    + torch_cuda: the ``torch.version.cuda`` torch must report, e.g. ``"13.0"`` (None: no check)
    + env: extra environment of the installer
    + compile_bytecode: with uv, compile the venv's sources to .pyc as pip does (a root-owned venv
      whose tools run as other users could not cache them: each run would compile them again)

    A torch whose version matches but whose CUDA build does not is not reinstalled (the same
    source would give the same build): the host fails with both values and the fix.

    **Example:**

    .. code:: python

        pyenv.packages(venv="/opt/servefleet/venvs/vllm-0.24.0", uv="/opt/servefleet/tools/venv/bin/uv",
                       pins={"torch": "2.11.0", "vllm": "0.24.0"}, torch_cuda="13.0")
    """
    found = batch.get(host, DistVersions, venv=venv, names=tuple(pins))
    if versions_match(found, pins):
        problems = _problems(venv, pins, torch_cuda)
        if problems:
            yield fail_host(f"{host.name}: " + "; ".join(problems))
        else:
            host.noop(
                ", ".join(f"{n} {found[n]}" for n in pins)
                + f" in {venv}"
                + (f"; torch CUDA {torch_cuda}" if torch_cuda and "torch" in pins else "")
            )
        return

    python = f"{venv.rstrip('/')}/bin/python"
    if uv:
        args = [uv, "pip", "install", "--quiet", "--python", python, *sources]
    else:
        args = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *sources]
    if no_deps:
        args.append("--no-deps")
    if uv and compile_bytecode:
        args.append("--compile-bytecode")
    args += [f"{name}=={pin}" for name, pin in pins.items()]
    yield _env_prefix(env) + " ".join(shlex.quote(a) for a in args)

    # Execution resumes here after the install ran: read the venv back (fresh facts).
    batch.forget(host)
    problems = _problems(venv, pins, torch_cuda)
    if problems:
        yield fail_host(f"{host.name}: after installing, " + "; ".join(problems))
