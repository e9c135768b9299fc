"""The llama.cpp Q4 recipe's steps (deploys/serve_q4_llamacpp.py reads them top to bottom).

    build_packages()  build-essential, cmake, git, ccache (per OS family, from data)
    build()           llama-server at the pinned commit into llama.cpp/<tag>-<hash>/, `current`
                      switched to it; nothing when that build is installed
    model()           the GGUF (servefleet.recipes.models.ensure_model)
    gguf_lint()       gguf in the tools venv, the lint script on the node, the file linted
    service()         servefleet-llama.service from files/llamacpp/, --override-kv from the lint;
                      the release it installs recorded (servefleet.core.releases)
    health()          /health, one chat, settle, only when the service (re)started

Pure logic (build identity, the unit's values): servefleet.engines.llamacpp.logic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import File

from servefleet.core import lint as lints
from servefleet.engines.llamacpp import ENGINE, logic, operations as ops, readers
from servefleet.engines.llamacpp.facts import GgufLint, LlamaBuilds, Nvcc
from servefleet.facts import batch
from servefleet.facts.node import FreeDiskBytes, InstalledDebs
from servefleet.facts.pyenv import DistVersions
from servefleet.operations import files
from servefleet.recipes import base, releases, serving
from servefleet.recipes.models import ModelRun, ensure_model, model_dir, model_reads
from servefleet.recipes.service import ServiceRun, systemd_service
from servefleet.recipes.steps import deploy

UNIT_TEMPLATE = logic.TEMPLATE
PREFLIGHT_SCRIPT = "files/llamacpp/llama-preflight.sh"
# The lint runs on the node with the tools venv's gguf: servefleet's own module, uploaded.
# The lint's files, uploaded to the node and run there; not imported here (gguf imports numpy:
# a quarter of a second of every operator run).
LINT_SOURCE = Path(lints.__file__).with_name("gguf_lint.py")
LINT_HEADER_SOURCE = LINT_SOURCE.with_name("gguf_header.py")  # imported by the lint, beside it
# gguf in the tools venv reads GGUF headers for the lint.
GGUF_TOOLS = {"gguf": "llamacpp_gguf_version"}


def plan_reads() -> None:
    """Everything this recipe's steps read on the node besides the base, planned as one read
    (servefleet.facts.batch): the same facts with the same arguments the steps ask for."""
    data, lay = base.data(), base.layout()
    model = model_dir(data["model_repo"], data["model_revision"])
    batch.plan(
        host,
        [
            (InstalledDebs, {"names": base.package_query("llamacpp_build_packages")}),
            (LlamaBuilds, {"llama_dir": lay.llama_dir}),
            *([(Nvcc, {})] if logic.cuda_on(logic.cmake_flags(data)) else []),
            (FreeDiskBytes, {"path": lay.llama_dir}),
            *model_reads(model),
            (DistVersions, {"venv": lay.tools_venv, "names": tuple(GGUF_TOOLS)}),
            *base.upload_reads(
                lay.bin("servefleet-llama-build"),
                lay.bin("gguf_header.py"),
                lay.bin("servefleet-gguf-lint"),
                lay.bin("servefleet-llama-preflight"),
                lay.bin("servefleet-health"),
                lay.bin(serving.ENGINE_CLIENT_NAME),
                lay.unit_path(logic.UNIT),
            ),
            (GgufLint, _lint_args(model)),
            (File, {"path": lay.api_key_file}),
            *serving.service_reads(lay, logic.UNIT),
        ],
    )


def begin() -> bool:
    """deploys/serve_q4_llamacpp.py's start: data checked, this recipe's reads planned with the
    base's; False (a visible no-op) on a host of another engine."""
    return base.begin(ENGINE.deploy, plan=plan_reads)


@dataclass
class Build:
    name: str
    prefix: str
    build: OperationMeta  # built in this run
    switch: OperationMeta  # `current` moved in this run


@deploy("llama.cpp build packages")
def build_packages():
    base.os_packages("llamacpp_build_packages")


@deploy("llama.cpp build")
def build() -> Build:
    data, lay = base.data(), base.layout()
    name, flags = logic.build_name(data), logic.cmake_flags(data)
    cuda = logic.cuda_on(flags)
    made = ops.build(
        name=f"Build llama-server {data['llamacpp_tag']} ({data['llamacpp_commit'][:10]}) -> {name}",
        build=name,
        prefix=lay.llama_prefix(name),
        src_dir=lay.llama_src,
        build_dir=lay.llama_build_dir,
        llama_dir=lay.llama_dir,
        script=lay.bin("servefleet-llama-build"),
        git_url=data["llamacpp_git_url"],
        commit=data["llamacpp_commit"],
        tag=data["llamacpp_tag"],
        cmake_flags=flags,
        flags_hash=logic.flags_hash(data["llamacpp_commit"], flags),
        launcher_args=logic.launcher_args(data),
        jobs=data.get("llamacpp_build_jobs"),
        ccache_dir=data.get("llamacpp_ccache_dir"),
        min_free_disk=data["llamacpp_build_min_free_disk_bytes"],
        min_nvcc=data["llamacpp_min_nvcc_version"] if cuda else None,
        cuda=cuda,
    )
    switch = ops.switch(
        name=f"llama.cpp current -> {name}",
        llama_dir=lay.llama_dir,
        prefix=lay.llama_prefix(name),
        current=lay.llama_current,
    )
    return Build(name=name, prefix=lay.llama_prefix(name), build=made, switch=switch)


@deploy("Model")
def model() -> ModelRun:
    """The GGUF on the node (hub or depot, as data says)."""
    data = base.data()
    return ensure_model(
        repo_id=data["model_repo"], revision=data["model_revision"], include=[data["model_file"]]
    )


def _lint_args(model_dir: str) -> dict:
    return readers.lint_args(base.data(), model_dir)


@deploy("GGUF lint")
def gguf_lint_step(run: ModelRun):
    """gguf in the tools venv and the lint on the node; the model file linted there."""
    base.tools(GGUF_TOOLS)
    args = _lint_args(run.path)
    files.upload(
        name="GGUF header check",
        dest=base.layout().bin("gguf_header.py"),
        content=LINT_HEADER_SOURCE.read_bytes(),
        mode="644",
    )
    files.upload(
        name="GGUF lint script", dest=args["script"], content=LINT_SOURCE.read_bytes(), mode="644"
    )
    ops.check_gguf(name="GGUF lint of the model file", **args)


def override_kv(model_dir: str):
    """() -> the lint's --override-kv value, read on the node when the template renders."""
    return readers.override_kv(host, base.data(), model_dir)


@deploy("llama.cpp service")
def service(built: Build, run: ModelRun) -> ServiceRun:
    lay = base.layout()
    files.upload(
        name="Start preflight script (free VRAM/RAM)",
        dest=lay.bin("servefleet-llama-preflight"),
        content=open(PREFLIGHT_SCRIPT, "rb").read(),
        mode="755",
    )
    key = serving.api_key()
    data = base.data()
    context = logic.unit_context(data, run.path, override_kv(run.path))
    probe = logic.probe_argv(data)
    release_of = releases.build(
        engine=ENGINE,
        version=data["llamacpp_tag"],
        prefix=built.prefix,
        unit=logic.UNIT,
        template=UNIT_TEMPLATE,
        context=context,
        model_dir=run.path,
        gate=gate_args(),
        probe_argv=probe,
        commit=data["llamacpp_commit"],
    )
    return systemd_service(
        logic.UNIT,
        UNIT_TEMPLATE,
        context,
        release_of,
        probe,
        depends_on=[built.build, built.switch, run, key],
    )


def gate_args() -> dict:
    """The health check's arguments for this host (also a rollout's gate)."""
    return serving.gate_args(logic.UNIT)


@deploy("llama.cpp health")
def health(svc: ServiceRun):
    """Only when the service was (re)started in this run: /health, one chat, settle."""
    serving.health("llama.cpp /health, one chat completion, settle", svc, gate_args(), ENGINE)
