"""The BF16 vLLM recipe's steps (deploys/serve_bf16.py reads them top to bottom).

    python_env()        uv venv per vLLM version, torch + vLLM pinned, versions read back
    patch()             qwen3_5.py: no vision tower with --language-model-only
    model()             the checkpoint (servefleet.recipes.models.ensure_model), linted on the node
    page_cache()        evict the model files from the page cache when vLLM auto-sizes its pool
    memory_preflight()  plan-kv + weights/pool/overhead budget against usable memory
    service()           servefleet-vllm.service from files/vllm/, the release it installs recorded
                        (servefleet.core.releases), restarted when what it runs changed
    health()            /health, the engine's KV log lines against plan-kv, one chat, settle

Pure logic (the serve command, the unit's values, the verdicts): servefleet.engines.vllm.logic.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import File

from servefleet.core.python_env import source_args
from servefleet.engines.vllm import ENGINE, logic
from servefleet.engines.vllm.facts import SafetensorsBytes, VllmModelFile, VllmVersion
from servefleet.engines.vllm.operations import patch as vllm_patch, preflight as vllm_preflight
from servefleet.facts import batch
from servefleet.facts.node import MemoryBytes, PathStat
from servefleet.facts.pyenv import DistVersions, TorchCuda
from servefleet.operations import files, pyenv
from servefleet.recipes import base, releases, serving
from servefleet.recipes.models import ModelRun, ensure_model, model_dir, model_reads
from servefleet.recipes.service import ServiceRun, systemd_service
from servefleet.recipes.steps import Changes, deploy

UNIT_TEMPLATE = logic.TEMPLATE
EVICT_SCRIPT = "files/pagecache/evict.py"


def plan_reads() -> None:
    """Everything this recipe's steps read on the node besides the base, planned as one read
    (servefleet.facts.batch): the same facts with the same arguments the steps ask for."""
    data, lay = base.data(), base.layout()
    venv = logic.venv_path(data)
    model = model_dir(data["model_repo"], data["model_revision"])
    batch.plan(
        host,
        [
            (PathStat, {"path": f"{venv}/pyvenv.cfg"}),
            (PathStat, {"path": f"{venv}/.lock"}),
            (DistVersions, {"venv": venv, "names": tuple(logic.pins(data))}),
            (TorchCuda, {"venv": venv}),
            (VllmVersion, {"venv": venv}),
            (VllmModelFile, {"venv": venv, "filename": vllm_patch.MODEL_FILE}),
            *model_reads(model),
            *vllm_preflight.model_file_reads(model, data["servefleet_user"]),
            (SafetensorsBytes, {"path": model, "user": data["servefleet_user"]}),
            (MemoryBytes, {}),
            *base.upload_reads(
                lay.bin("servefleet-evict-page-cache"),
                lay.bin("servefleet-health"),
                lay.bin(serving.ENGINE_CLIENT_NAME),
                lay.unit_path(logic.UNIT),
            ),
            *[(File, {"path": p}) for p in (lay.api_key_file, lay.vllm_env_file)],
            *([(File, {"path": data["vllm_executable"]})] if data.get("vllm_executable") else []),
            *serving.service_reads(lay, logic.UNIT),
        ],
    )


def begin() -> bool:
    """deploys/serve_bf16.py's start: data checked, this recipe's reads planned with the base's;
    False (a visible no-op) on a host of another engine."""
    return base.begin(ENGINE.deploy, plan=plan_reads)


@dataclass
class PythonEnv:
    venv: str
    create: OperationMeta  # the venv
    install: OperationMeta  # the pinned install (+ read-back check)


@deploy("vLLM Python environment")
def python_env() -> PythonEnv:
    data, lay = base.data(), base.layout()
    venv = logic.venv_path(data)
    uv = lay.tools_bin("uv")
    create = pyenv.venv(
        name=f"venv {venv} (uv)", path=venv, uv=uv, python=base.python(), env=logic.uv_env(data)
    )
    install = pyenv.packages(
        name=f"torch=={data['torch_version']} vllm=={data['vllm_version']}, read back",
        venv=venv,
        uv=uv,
        pins=logic.pins(data),
        torch_cuda=data["torch_cuda"],
        sources=source_args(data),
        no_deps=data["python_no_deps"],
        env=logic.uv_env(data),
    )
    base.uv_lock_roots(venv)  # vllm and python, run by root from this venv
    return PythonEnv(venv=venv, create=create, install=install)


@deploy("vLLM patch")
def patch(env: PythonEnv) -> OperationMeta:
    """The language-model-only patch (servefleet.engines.vllm.operations.patch), or vLLM's own file."""
    if host.data.vllm_patch:
        return vllm_patch.apply(
            name="qwen3_5.py: no vision tower with --language-model-only",
            venv=env.venv,
            workdir=base.layout().bin_dir,
        )
    return vllm_patch.revert(name="qwen3_5.py: vLLM's own file (vllm_patch = False)", venv=env.venv)


@deploy("Model")
def model() -> ModelRun:
    """The checkpoint on the node, then its lint against the recipe (fails this host only)."""
    data = base.data()
    run = ensure_model(
        repo_id=data["model_repo"],
        revision=data["model_revision"],
        include=list(data["model_include"]),
    )
    vllm_preflight.checkpoint_lint(
        name="Lint the checkpoint against the recipe",
        path=run.path,
        language_model_only=data["language_model_only"],
        user=data["servefleet_user"],
    )
    return run


@deploy("Page cache")
def page_cache(run: ModelRun, depends_on: list[Changes]) -> OperationMeta:
    """Evict the model's files from the page cache when policy says so and something changed."""
    data, lay = base.data(), base.layout()
    script = lay.bin("servefleet-evict-page-cache")
    files.upload(
        name="Page-cache eviction script",
        dest=script,
        content=open(EVICT_SCRIPT, "rb").read(),
        mode="755",
    )
    applies = logic.page_cache_applies(data)
    deps: list[Changes] = [run, *depends_on]
    return vllm_preflight.evict_page_cache(
        name=f"Evict {run.path} from the page cache (policy {data['page_cache_policy']})",
        path=run.path,
        script=script,
        user=data["servefleet_user"],
        python=base.python(),
        record=lay.page_cache_record,
        drop_caches=data["page_cache_drop_global"],
        _if=lambda: applies and any(d.did_change() for d in deps),
    )


@deploy("Memory preflight")
def memory_preflight(run: ModelRun):
    data = base.data()
    vllm_preflight.memory_preflight(
        name="plan-kv and memory budget", path=run.path, data=data, user=data["servefleet_user"]
    )


@deploy("vLLM service")
def service(env: PythonEnv, run: ModelRun, depends_on: list[Changes]) -> ServiceRun:
    data = base.data()
    executable_check(data)
    key = serving.api_key(base.layout().vllm_env_file, "VLLM_API_KEY")
    context = logic.unit_context(data, run.path)
    probe = logic.probe_argv(data)
    release_of = releases.build(
        engine=ENGINE,
        version=data["vllm_version"],
        prefix=env.venv,
        unit=logic.UNIT,
        template=UNIT_TEMPLATE,
        context=context,
        model_dir=run.path,
        gate=gate_args(run.path),
        probe_argv=probe,
    )
    # Positional: `name=` would be taken by pyinfra as the deploy's display name.
    return systemd_service(
        logic.UNIT,
        UNIT_TEMPLATE,
        context,
        release_of,
        probe,
        depends_on=[env.create, env.install, *depends_on, run, key],
    )


def executable_check(data) -> None:
    """vllm_executable (testbed only) must be root's: root starts what it names."""
    if data.get("vllm_executable"):
        files.root_owned(name=f"{data['vllm_executable']} is root's", path=data["vllm_executable"])


@deploy("vLLM health")
def health(run: ModelRun, svc: ServiceRun):
    """Only when the service was (re)started in this run: /health, KV lines, a chat, settle."""
    serving.health(
        "vLLM /health, KV cache log vs plan-kv, one chat completion, settle",
        svc,
        gate_args(run.path),
        ENGINE,
    )


def gate_args(model_path: str) -> dict:
    """The health check's arguments for this host (also a rollout's gate): the shared ones and
    the KV comparison with plan-kv, read from the checkpoint's config.json as the service user."""
    data = base.data()
    return serving.gate_args(
        logic.UNIT,
        kv_config=f"{model_path}/config.json",
        kv_data={
            k: data[k] for k in ("max_model_len", "kv_cache_memory_bytes", "kv_block_alignment")
        },
        engine_version=data["vllm_version"],
        kv_user=data["servefleet_user"],
    )
