"""The serving venv of a vLLM version: made with uv, torch and vLLM pinned, read back.

Both operations are no-ops when the node is already as data says, so a converge with nothing
to do yields no command. Versions are read from the venv's dist-info (facts_vllm.DistVersions)
and torch.version.cuda from torch/version.py (facts_vllm.TorchCuda), never by importing.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import File

from servefleet.facts_vllm import DistVersions, TorchCuda
from servefleet.operations.node import fail_host
from servefleet.python_env import source_args
from servefleet.vllm import version_problems, versions_match


def _env_prefix(env: dict | None) -> str:
    if not env:
        return ""
    return "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " "


@operation()
def venv(path: str, uv: str, python: str = "python3", env: dict | None = None):
    """
    Create a virtualenv with uv unless one is there (its ``pyvenv.cfg``).

    + path: the venv directory
    + uv: the uv binary (servefleet's tools venv has one)
    + python: interpreter the venv is made from (name on PATH or a path)
    + env: extra environment of the uv command

    **Example:**

    .. code:: python

        vllm_env.venv(path="/opt/servefleet/venvs/vllm-0.24.0",
                      uv="/opt/servefleet/tools/venv/bin/uv", python="python3")
    """
    if host.get_fact(File, path=f"{path.rstrip('/')}/pyvenv.cfg"):
        host.noop(f"venv {path} exists")
        return
    yield (f"{_env_prefix(env)}{shlex.quote(uv)} venv --quiet --python {shlex.quote(python)} "
           f"{shlex.quote(path)}")


def _problems(venv: str, pins: dict, torch_cuda: str) -> list[str]:
    found = host.get_fact(DistVersions, venv=venv, names=tuple(pins))
    cuda = host.get_fact(TorchCuda, venv=venv) if "torch" in found else None
    return version_problems(found, pins, cuda, torch_cuda, venv)


@operation()
def packages(venv: str, uv: str, pins: dict, torch_cuda: str, data: dict,
             env: dict | None = None):
    """
    Install pinned packages into a venv with uv when the installed versions differ, then read
    the versions back and fail this host, naming both values, if they are not the pins.

    + venv: the venv directory (made by ``venv``)
    + uv: the uv binary
    + pins: ``{distribution: version}``, e.g. ``{"torch": "2.11.0", "vllm": "0.24.0"}``
    + torch_cuda: the ``torch.version.cuda`` the build must report, e.g. ``"13.0"``
    + data: recipe data: package sources (pip_index_url, pip_extra_index_urls, pip_find_links)
      and python_no_deps (install only the pinned wheels, e.g. from a wheelhouse)
    + env: extra environment of the uv command

    A torch whose version matches but whose CUDA build does not is not reinstalled (the same
    source would give the same build): the host fails with both values and the fix.

    **Example:**

    .. code:: python

        vllm_env.packages(venv="/opt/servefleet/venvs/vllm-0.24.0",
                          uv="/opt/servefleet/tools/venv/bin/uv",
                          pins={"torch": "2.11.0", "vllm": "0.24.0"}, torch_cuda="13.0",
                          data=host.data.dict())
    """
    found = host.get_fact(DistVersions, venv=venv, names=tuple(pins))
    if versions_match(found, pins):
        problems = _problems(venv, pins, torch_cuda)
        if problems:
            yield fail_host(f"{host.name}: " + "; ".join(problems))
        else:
            host.noop(f"{', '.join(f'{n} {found[n]}' for n in pins)} in {venv}; torch CUDA "
                      f"{torch_cuda}")
        return

    args = [uv, "pip", "install", "--quiet", "--python", f"{venv.rstrip('/')}/bin/python",
            *source_args(data)]
    if data.get("python_no_deps"):
        args.append("--no-deps")
    args += [f"{name}=={pin}" for name, pin in pins.items()]
    yield _env_prefix(env) + " ".join(shlex.quote(a) for a in args)

    # Execution resumes here after the install ran: read the venv back (fresh facts).
    problems = _problems(venv, pins, torch_cuda)
    if problems:
        yield fail_host(f"{host.name}: after installing, " + "; ".join(problems))

