"""
Operations of the llama.cpp recipe: build llama-server at a pinned commit into a versioned
prefix, switch `current`, check the GGUF lint. Paths come from the caller (NodeLayout)::

    llama.cpp/src/                 git clone of the source (checked out at the pinned commit)
    llama.cpp/build/               scratch build tree, wiped before and after each build
    llama.cpp/<tag>-<hash>/        one installed build: bin/llama-server + build.json
    llama.cpp/current -> <tag>-<hash>   the build of the current release

``build.json`` records tag, commit, ``git describe``, the CMake flags, their hash and
``llama-server --version``; the ``LlamaBuilds`` fact reads it, so an unchanged rerun is a no-op.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import StringCommand, operation

from servefleet.engines.llamacpp.facts import GgufLint, LlamaBuilds, Nvcc
from servefleet.engines.llamacpp.logic import build_env, build_present, build_problems
from servefleet.facts import batch
from servefleet.facts.node import FreeDiskBytes
from servefleet.operations.files import upload
from servefleet.operations.node import fail_host

# The operator's project: pyinfra resolves files/ against the current directory.
BUILD_SCRIPT = Path("files") / "llamacpp" / "build.sh"


@operation()
def build(
    build: str,
    prefix: str,
    src_dir: str,
    build_dir: str,
    script: str,
    git_url: str,
    commit: str,
    tag: str,
    cmake_flags: dict,
    flags_hash: str,
    llama_dir: str,
    launcher_args: Sequence[str] = (),
    jobs: int | None = None,
    ccache_dir: str | None = None,
    min_free_disk: int = 0,
    min_nvcc: str | None = None,
    cuda: bool = False,
):
    """
    Build llama-server at a pinned commit into ``prefix``, unless that build is installed.

    + build: the prefix's name, ``<tag>-<flags_hash>``
    + prefix, src_dir, build_dir, llama_dir: where it goes (NodeLayout)
    + script: where files/llamacpp/build.sh goes on the node (root-owned)
    + git_url: clone/fetch URL (a mirror or a local path works)
    + commit: the 40-hex commit that is built; HEAD is verified against it
    + tag: a label recorded with the build (``git describe`` is recorded too)
    + cmake_flags: {VAR: VALUE} passed as -DVAR=VALUE; part of the build's identity
    + flags_hash: hash of commit + flags, recorded in build.json
    + launcher_args: compiler launcher flags (ccache); not part of the identity
    + jobs: parallel compile jobs (None: the CPU count, at most one per 2 GiB of available RAM)
    + ccache_dir: CCACHE_DIR for the build (None: ccache's default)
    + min_free_disk: bytes that must be free under llama_dir before building
    + min_nvcc: oldest nvcc accepted (None: no check)
    + cuda: GGML_CUDA is on (servefleet.engines.llamacpp.logic.cuda_on)

    Refusals (no nvcc, old nvcc, no disk) and build errors fail this host only. The running
    service is untouched: its unit names its own build prefix.

    **Example:**

    .. code:: python

        llamacpp.build(build="b9784-0123abcd4567", prefix="/opt/servefleet/llama.cpp/b9784-0123abcd4567",
                       src_dir="/opt/servefleet/llama.cpp/src", build_dir="/opt/servefleet/llama.cpp/build",
                       llama_dir="/opt/servefleet/llama.cpp", script="/opt/servefleet/bin/servefleet-llama-build",
                       git_url="https://github.com/ggml-org/llama.cpp.git",
                       commit="8be759e6f70d629638a7eb70db3824cbdcea370b", tag="b9784",
                       cmake_flags={"GGML_CUDA": "ON"}, flags_hash="0123abcd4567", cuda=True)
    """
    builds = batch.get(host, LlamaBuilds, llama_dir=llama_dir)
    if build_present(builds, build, commit, cmake_flags):
        host.noop(f"llama.cpp {build} is installed: {builds.records[build].get('version')}")
        return
    nvcc = batch.get(host, Nvcc) if cuda else None
    problems = build_problems(
        cuda=cuda and bool(min_nvcc),
        nvcc=nvcc,
        min_nvcc=min_nvcc or "0",
        free_disk=batch.get(host, FreeDiskBytes, path=llama_dir),
        min_free_disk=min_free_disk,
        root=llama_dir,
    )
    if problems:
        yield fail_host(f"llama.cpp build preflight failed on {host.name}: " + "; ".join(problems))
        return
    yield from upload._inner(dest=script, content=BUILD_SCRIPT.read_bytes(), mode="755")
    env = build_env(
        git_url=git_url,
        commit=commit,
        tag=tag,
        flags_hash=flags_hash,
        src_dir=src_dir,
        build_dir=build_dir,
        prefix=prefix,
        cmake_flags=cmake_flags,
        launcher_args=launcher_args,
        jobs=jobs,
        ccache_dir=ccache_dir,
        nvcc=nvcc["path"] if nvcc else None,
    )
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    yield StringCommand(f"env {assigns} {shlex.quote(script)}")


@operation()
def switch(llama_dir: str, prefix: str, current: str):
    """
    Point the ``current`` link at an installed build (atomically: a new link renamed over).

    + llama_dir: the builds' directory (facts are read there)
    + prefix: the installed build's prefix
    + current: the link

    **Example:**

    .. code:: python

        llamacpp.switch(llama_dir="/opt/servefleet/llama.cpp", current="/opt/servefleet/llama.cpp/current",
                        prefix="/opt/servefleet/llama.cpp/b9784-0123abcd4567")
    """
    builds = batch.get(host, LlamaBuilds, llama_dir=llama_dir)
    if builds.current == prefix:
        host.noop(f"llama.cpp current is {prefix.rsplit('/', 1)[-1]}")
        return
    t, tmp, cur = (shlex.quote(x) for x in (prefix, f"{current}.new", current))
    yield StringCommand(
        f"test -x {t}/bin/llama-server || {{ echo 'servefleet: no llama-server in {prefix}' >&2; "
        f"exit 1; }}; ln -sfn {t} {tmp} && mv -T {tmp} {cur}"
    )


@operation()
def check_gguf(python: str, script: str, path: str, user: str):
    """
    Fail this host when the GGUF lint cannot read the model file (corrupt, truncated, missing).

    + python: the tools venv's python (has ``gguf``)
    + script: gguf_lint.py on the node
    + path: the .gguf file
    + user: the service user, who runs the lint (root never parses what it can write)

    Before execution (first run: no file, no gguf yet) there is nothing to check.

    **Example:**

    .. code:: python

        llamacpp.check_gguf(python="/opt/servefleet/tools/venv/bin/python", user="servefleet",
                            script="/opt/servefleet/bin/gguf_lint.py", path="/m/model.gguf")
    """
    lint = batch.get(host, GgufLint, python=python, script=script, path=path, user=user)
    if lint.state == "ok":
        host.noop(
            f"GGUF lint of {path}: " + (f"--override-kv {lint.flag}" if lint.flag else "no defect")
        )
    elif lint.state == "error":
        yield fail_host(f"GGUF lint of {path} failed: {lint.detail}")
    elif state.is_executing:
        yield fail_host(f"GGUF lint of {path}: {lint.state} (file or gguf missing after install)")
    else:
        host.noop(f"GGUF lint of {path}: after the download")
