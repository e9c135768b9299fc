"""The BF16 vLLM recipe (deploys/serve_bf16.py): its data keys, its pure logic and its steps.

The deploy reads like the recipe; each step here reads its values from host.data (checked by
`KEYS` before any step runs) and calls operations from servefleet/operations/:

    python_env()        uv venv per vLLM version, torch + vLLM pinned, versions read back
    patch()             qwen3_5.py: no vision tower with --language-model-only
    model()             the checkpoint (servefleet.models.ensure_model), linted on the node
    page_cache()        evict the model files from the page cache when vLLM auto-sizes its pool
    memory_preflight()  plan-kv + weights/pool/overhead budget against usable memory
    service()           servefleet-vllm.service from files/vllm/, restarted when a dependency changed
    health()            /health, the engine's KV log lines against plan-kv, one chat completion
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files

from servefleet import kvplan, models, schema
from servefleet.paths import REPO_ROOT

UNIT = "servefleet-vllm.service"
UNIT_TEMPLATE = REPO_ROOT / "files" / "vllm" / "servefleet-vllm.service.j2"
HEALTH_SCRIPT = REPO_ROOT / "files" / "vllm" / "health.py"
EVICT_SCRIPT = REPO_ROOT / "files" / "pagecache" / "evict.py"

_VERSION = schema.Check("a release version like 0.24.0",
                        lambda v: isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)+", v) is not None)
_CUDA = schema.Check("a CUDA version like 13.0",
                     lambda v: isinstance(v, str) and re.fullmatch(r"\d+\.\d+", v) is not None)

# The recipe's keys (defaults and one-line comments: group_data/spark.py), with those of the
# model download (servefleet.models; defaults in group_data/all.py).
KEYS = {
    **models.MODEL_KEYS,
    **models.MODEL_DEPLOY_KEYS,
    "vllm_version": _VERSION,
    "torch_version": _VERSION,
    "torch_cuda": _CUDA,
    "uv_cache_dir": schema.optional(schema.ABS_PATH),
    "vllm_patch": schema.BOOL,
    "language_model_only": schema.BOOL,
    "served_model_name": schema.TEXT,
    "max_model_len": schema.integer(1),
    "kv_cache_memory_bytes": schema.optional(schema.integer(1)),
    "kv_block_alignment": schema.integer(1),
    "memory_overhead_bytes": schema.integer(0),
    "page_cache_policy": schema.one_of("auto", "always", "never"),
    "page_cache_drop_global": schema.BOOL,
    "vllm_extra_args": schema.list_of(schema.TEXT),
    "health_timeout_s": schema.integer(1),
}


# --- Pure logic (unit-tested) ------------------------------------------------------------------

def venv_path(data) -> str:
    """One venv per vLLM version: {root}/venvs/vllm-0.24.0."""
    return f"{data['servefleet_root']}/venvs/vllm-{data['vllm_version']}"


def model_dir(data) -> str:
    """Where the checkpoint lives on the node: model_dir, else {root}/models/{org}--{name}."""
    return data.get("model_dir") or (
        f"{data['servefleet_root']}/models/{data['model_repo'].replace('/', '--')}")


def env_file(data) -> str:
    """systemd EnvironmentFile holding VLLM_API_KEY (0600 root; systemd reads it as root)."""
    return f"{data['servefleet_root']}/etc/vllm.env"


def pins(data) -> dict[str, str]:
    return {"torch": data["torch_version"], "vllm": data["vllm_version"]}


def public_version(version: str) -> str:
    """2.11.0+cu130 -> 2.11.0: a pin without a local label matches any local label (PEP 440)."""
    return version.split("+", 1)[0]


def version_problems(found: dict[str, str], wanted: dict[str, str], cuda: str | None,
                     wanted_cuda: str, venv: str) -> list[str]:
    """What differs between the venv and the pins; [] when it is as data says."""
    problems = []
    for name, pin in wanted.items():
        have = found.get(name)
        if have is None:
            problems.append(f"{name} is not installed in {venv} (pinned {name}=={pin})")
        elif public_version(have) != pin:
            problems.append(f"{name} {have} is installed in {venv}, the pin is {name}=={pin}")
    if "torch" in found and cuda != wanted_cuda:
        problems.append(f"torch.version.cuda is {cuda or 'None (a CPU build)'} in {venv}, the "
                        f"recipe needs CUDA {wanted_cuda}: install torch from an index that "
                        f"serves the cu{wanted_cuda.replace('.', '')} build")
    return problems


def versions_match(found: dict[str, str], wanted: dict[str, str]) -> bool:
    return all(name in found and public_version(found[name]) == pin for name, pin in wanted.items())


def uv_env(data) -> dict[str, str]:
    """Environment of the uv commands: system CA store, never a uv-downloaded Python."""
    env = {"UV_SYSTEM_CERTS": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    if data.get("uv_cache_dir"):
        # A cache on another filesystem than the venv: copy, don't try to hardlink.
        env.update({"UV_CACHE_DIR": data["uv_cache_dir"], "UV_LINK_MODE": "copy"})
    return env


def page_cache_applies(data) -> bool:
    """Purge the model from the page cache? auto: only when vLLM sizes its pool from free memory."""
    policy = data["page_cache_policy"]
    if policy == "auto":
        return data.get("kv_cache_memory_bytes") is None
    return policy == "always"


def serve_args(data, model: str) -> list[str]:
    """`vllm serve` argv (after the binary) for this host's data."""
    args = [
        "serve", model,
        "--served-model-name", data["served_model_name"],
        "--dtype", "bfloat16",
        "--max-model-len", str(data["max_model_len"]),
        "--host", data["service_host"],
        "--port", str(data["service_port"]),
    ]
    if data["language_model_only"]:
        args.append("--language-model-only")
    if data.get("kv_cache_memory_bytes") is not None:
        args += ["--kv-cache-memory-bytes", str(data["kv_cache_memory_bytes"])]
    return args + list(data.get("vllm_extra_args") or [])


def unit_context(data, venv: str, model: str) -> dict:
    """Variables of files/vllm/servefleet-vllm.service.j2 (also rendered by the drift check)."""
    argv = [f"{venv}/bin/vllm", *serve_args(data, model)]
    return {"run_as": data["servefleet_user"], "root": data["servefleet_root"], "venv": venv,
            "exec_start": systemd_exec_line(argv),
            "env_file": env_file(data) if data.get("api_key_file") else None,
            "served_model_name": data["served_model_name"],
            "timeout_start_s": data["health_timeout_s"]}


def systemd_exec_line(argv: list[str]) -> str:
    """argv as an ExecStart= value, one option per continued line ('%' escaped for systemd)."""
    words = [shlex.quote(a).replace("%", "%%") for a in argv]
    lines, current = [], [words[0]]
    for word in words[1:]:
        if word.startswith("--"):
            lines.append(" ".join(current))
            current = [word]
        else:
            current.append(word)
    lines.append(" ".join(current))
    return " \\\n    ".join(lines)


@dataclass(frozen=True)
class MemoryVerdict:
    plan: kvplan.KVPlan
    budget: kvplan.Budget
    pool_source: str  # "data" (--kv-cache-memory-bytes) or "estimate" (vLLM auto-sizes)
    problems: list[str]

    def summary(self) -> str:
        gib = kvplan.format_gib
        p, b = self.plan, self.budget
        return (f"KV pool {gib(p.kv_cache_memory_bytes)} GiB ({self.pool_source}): block size "
                f"{p.block_size}, {p.num_blocks:,} blocks, GPU KV cache size {p.tokens:,} tokens, "
                f"maximum concurrency {p.max_concurrency:.2f}x at {p.max_model_len:,} tokens; weights "
                f"{gib(b.weights_bytes)} + pool {gib(b.kv_cache_memory_bytes)} + overhead "
                f"{gib(b.overhead_bytes)} = {gib(b.total_bytes)} of {gib(b.usable_memory_bytes)} "
                f"GiB usable")


def memory_verdict(config: dict, weights_bytes: int, usable_bytes: int, data) -> MemoryVerdict:
    """plan-kv and the memory budget for this host; problems name the numbers.

    With kv_cache_memory_bytes the pool is exact (vLLM takes it as given). Without it vLLM sizes
    the pool from free memory at startup; the preflight then plans with what is left of usable
    memory after weights and overhead, an estimate that still catches a model that cannot fit.
    """
    overhead = data["memory_overhead_bytes"]
    pool = data.get("kv_cache_memory_bytes")
    source = "data"
    if pool is None:
        pool, source = max(usable_bytes - weights_bytes - overhead, 0), "estimate"
    plan = kvplan.plan_kv(config, data["max_model_len"], pool,
                          block_alignment=data["kv_block_alignment"])
    bud = kvplan.budget(weights_bytes, pool, usable_memory_bytes=usable_bytes,
                        overhead_bytes=overhead)
    gib = kvplan.format_gib
    problems = []
    if not plan.fits:
        hint = (f"; it holds at most {plan.estimated_max_model_len:,} tokens per request"
                if plan.estimated_max_model_len else "")
        problems.append(
            f"vLLM would refuse to start: one {plan.max_model_len:,}-token request needs "
            f"{gib(plan.needed_bytes)} GiB ({plan.needed_bytes:,} bytes) of KV cache, the pool is "
            f"{gib(pool)} GiB ({pool:,} bytes){hint}; raise kv_cache_memory_bytes or lower "
            f"max_model_len")
    if not bud.fits:
        problems.append(
            f"weights {gib(bud.weights_bytes)} + KV pool {gib(pool)} + overhead "
            f"{gib(overhead)} = {gib(bud.total_bytes)} GiB > {gib(usable_bytes)} GiB usable "
            f"(short by {gib(bud.total_bytes - usable_bytes)} GiB); lower kv_cache_memory_bytes "
            f"or set usable_memory_bytes to what this host really has")
    return MemoryVerdict(plan, bud, source, problems)


# --- Steps of the recipe (read top to bottom by deploys/serve_bf16.py) ------------------------

@dataclass
class PythonEnv:
    venv: str
    create: object  # OperationMeta of the venv
    install: object  # OperationMeta of the pinned install (+ read-back check)


@deploy("vLLM Python environment")
def python_env() -> PythonEnv:
    from servefleet.base import tools_venv, _per_family
    from servefleet.operations import vllm_env

    data = host.data.dict()
    venv = venv_path(data)
    create = vllm_env.venv(name=f"venv {venv} (uv)", path=venv, uv=f"{tools_venv()}/bin/uv",
                           python=_per_family("python_interpreter"), env=uv_env(data))
    install = vllm_env.packages(
        name=f"torch=={data['torch_version']} vllm=={data['vllm_version']}, read back",
        venv=venv, uv=f"{tools_venv()}/bin/uv", pins=pins(data), torch_cuda=data["torch_cuda"],
        data=data, env=uv_env(data))
    return PythonEnv(venv=venv, create=create, install=install)


@deploy("vLLM patch")
def patch(env: PythonEnv):
    """The language-model-only patch (servefleet.operations.vllm_patch), or vLLM's own file."""
    from servefleet.operations import vllm_patch

    if host.data.vllm_patch:
        return vllm_patch.apply(name="qwen3_5.py: no vision tower with --language-model-only",
                                venv=env.venv)
    return vllm_patch.revert(name="qwen3_5.py: vLLM's own file (vllm_patch = False)",
                             venv=env.venv)


@deploy("Model")
def model():
    """The checkpoint on the node, then its lint against the recipe (fails this host only)."""
    from servefleet.operations import vllm_serve

    data = host.data.dict()
    run = models.ensure_model(repo_id=data["model_repo"], revision=data["model_revision"],
                       include=list(data["model_include"]), dest=model_dir(data))
    vllm_serve.checkpoint_lint(name="Lint the checkpoint against the recipe", path=run.path,
                               language_model_only=data["language_model_only"])
    return run


@deploy("Page cache")
def page_cache(run, depends_on: list):
    """Evict the model's files from the page cache when policy says so and something changed."""
    from servefleet.base import _per_family
    from servefleet.operations import vllm_serve

    data = host.data.dict()
    script = f"{data['servefleet_root']}/bin/servefleet-evict-page-cache"
    files.put(name="Page-cache eviction script", src=str(EVICT_SCRIPT), dest=script, mode="755")
    applies = page_cache_applies(data)
    deps = [run, *depends_on]
    return vllm_serve.evict_page_cache(
        name=f"Evict {run.path} from the page cache (policy {data['page_cache_policy']})",
        path=run.path, script=script, python=_per_family("python_interpreter"),
        record=f"{data['servefleet_root']}/state/page-cache-evict.json",
        drop_caches=data["page_cache_drop_global"],
        _if=lambda: applies and any(d.did_change() for d in deps),
    )


@deploy("Memory preflight")
def memory_preflight(run):
    from servefleet.operations import vllm_serve

    data = host.data.dict()
    vllm_serve.memory_preflight(name="plan-kv and memory budget", path=run.path, data=data)


@deploy("vLLM service")
def service(env: PythonEnv, run, depends_on: list):
    from servefleet.service import systemd_service

    data = host.data.dict()
    key_file = env_file(data)
    if data.get("api_key_file"):
        key = Path(data["api_key_file"]).expanduser().read_text().strip()
        key_op = files.put(name=f"API key -> {key_file} (0600)", src=StringIO(f"VLLM_API_KEY={key}\n"),
                           dest=key_file, user="root", group="root", mode="600")
    else:
        key_op = files.file(name=f"No API key file ({key_file})", path=key_file, present=False)
    # Positional: `name=` would be taken by pyinfra as the deploy's display name.
    return systemd_service(
        UNIT, str(UNIT_TEMPLATE), unit_context(data, env.venv, run.path),
        depends_on=[env.create, env.install, *depends_on, run, key_op],
    )


@deploy("vLLM health")
def health(run, svc):
    """Only when the service was (re)started in this run: /health, KV log lines, one chat."""
    from servefleet.base import _per_family
    from servefleet.operations import vllm_serve

    data = host.data.dict()
    # started() is also true when a stopped-by-data unit was only enabled in this run.
    running = data["service_state"] == "running"
    script = f"{data['servefleet_root']}/bin/servefleet-vllm-health"
    files.put(name="Health check script", src=str(HEALTH_SCRIPT), dest=script, mode="755")
    vllm_serve.health(name="vLLM /health, KV cache log vs plan-kv, one chat completion",
                      path=run.path, script=script, python=_per_family("python_interpreter"),
                      data=data, _if=lambda: running and svc.started())
