"""vLLM's pure logic: pins, the serve command, the unit's values, the sandbox probe, the memory
verdict. Unit-tested; the steps (servefleet.engines.vllm.steps) and drift both call it."""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.core import drift_items as di, sandbox, systemd as sd
from servefleet.core.layout import VLLM_UNIT, NodeLayout
from servefleet.core.python_env import UV_ENV
from servefleet.engines.vllm.logic import kvplan

UNIT = VLLM_UNIT
TEMPLATE = "files/vllm/servefleet-vllm.service.j2"
ENGINE = "vllm"  # what its release records name
# vLLM versions whose KV-cache arithmetic plan-kv was checked against the real engine on a GPU
# (tests/fixtures/h200/vllm/: same lines for the same config, and plan-kv matched them). For
# any other version the health gate says "KV not compared" instead of passing silently.
KV_VERIFIED_VERSIONS = ("0.24.0", "0.26.0")
# The service's PATH: the venv first (vLLM's subprocesses and compilers find its tools).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# AF_NETLINK too: vLLM always sets up torch.distributed with a gloo CPU group, and gloo finds
# its address with getifaddrs(), a netlink socket. Without it the engine dies at start with
# "Address family not supported by protocol" (seen on the H200 under the emulated sandbox,
# tests/fixtures/h200/sandbox/).
ADDRESS_FAMILIES = ("AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK")
# MemoryDenyWriteExecute= for the vLLM unit too: the real engine served on the H200 under it
# (systemd's seccomp rules and the kernel's PR_SET_MDWE; tests/fixtures/h200/sandbox/). Triton
# and torch.compile write GPU code to files the driver loads; no host memory is mapped W+X.
MEMORY_DENY_WRITE_EXECUTE = True


def venv_path(data) -> str:
    return NodeLayout.of(data).engine_venv(ENGINE, data["vllm_version"])


def pins(data) -> dict[str, str]:
    return {"torch": data["torch_version"], "vllm": data["vllm_version"]}


def uv_env(data) -> dict[str, str]:
    """Environment of the uv commands: system CA store, never a uv-downloaded Python."""
    env = dict(UV_ENV)
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
    """`vllm serve` argv (after the executable) for this host's data."""
    args = [
        "serve",
        model,
        "--served-model-name",
        data["served_model_name"],
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(data["max_model_len"]),
        "--host",
        data["service_host"],
        "--port",
        str(data["service_port"]),
    ]
    if data["language_model_only"]:
        args.append("--language-model-only")
    if data.get("trust_remote_code"):
        args.append("--trust-remote-code")
    if data.get("kv_cache_memory_bytes") is not None:
        args += ["--kv-cache-memory-bytes", str(data["kv_cache_memory_bytes"])]
    return args + list(data.get("vllm_extra_args") or [])


def executable(data) -> str:
    """The venv's `vllm`; on the testbed only, vllm_executable (the engine stand-in)."""
    return data.get("vllm_executable") or f"{venv_path(data)}/bin/vllm"


def unit_context(data, model: str) -> dict:
    """Variables of files/vllm/servefleet-vllm.service.j2, every one escaped for systemd.
    model: the model's directory on the node (its revision resolved to a commit)."""
    lay = NodeLayout.of(data)
    venv = venv_path(data)
    env = {
        "HOME": lay.cache_dir,
        "VIRTUAL_ENV": venv,
        "PATH": f"{venv}/bin:{SYSTEM_PATH}",
        # Compile caches (torch.compile, Triton, vLLM) go to the service's own writable dir.
        "XDG_CACHE_HOME": lay.cache_dir,
        "VLLM_CACHE_ROOT": f"{lay.cache_dir}/vllm",
        "HF_HOME": f"{lay.cache_dir}/hf-engine",
        # The model is on local disk: vLLM and the hub client never reach the network for it.
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return {
        "service_user": sd.setting(data["servefleet_user"]),
        "working_directory": sd.setting(lay.cache_dir),
        "environment": [sd.environment(k, v) for k, v in env.items()],
        "env_file": sd.setting(lay.vllm_env_file) if data.get("api_key_file") else None,
        "exec_start": sd.exec_line([executable(data), *serve_args(data, model)]),
        "description": sd.text(data["served_model_name"]),
        "timeout_start_s": int(data["health_timeout_s"]),
        "sandbox": sandbox.properties(
            lay.writable_dirs,
            gpu=bool(data["require_gpu"]),
            memory_deny_write_execute=MEMORY_DENY_WRITE_EXECUTE,
            syscall_filter=data["service_syscall_filter"],
            address_families=ADDRESS_FAMILIES,
            hidden_paths=lay.engine_hidden_dirs,
        ),
        "gpu_setup": sandbox.gpu_setup_line() if data["require_gpu"] else None,
    }


def probe_argv(data) -> list[str]:
    """What the sandbox probe runs before a (re)start (servefleet.core.sandbox). GPU node: the
    venv's torch initialises CUDA and names the device. Without a GPU (the testbed): the
    executable the unit starts, asked for its version."""
    if data["require_gpu"]:
        return [
            f"{venv_path(data)}/bin/python",
            "-c",
            "import torch; torch.cuda.init(); print(torch.cuda.get_device_name(0))",
        ]
    return [executable(data), "--version"]


def model_include(data) -> list[str]:
    """The files of the model repo the recipe fetches."""
    return list(data["model_include"])


def version_items(data, found: dict[str, str], cuda: str | None) -> list[di.Item]:
    """The venv's torch and vLLM (and torch's CUDA) against the pins."""
    return di.version_items(venv_path(data), found, pins(data), cuda, data["torch_cuda"])


def kv_compared(version: str) -> bool:
    return version in KV_VERIFIED_VERSIONS


@dataclass(frozen=True)
class MemoryVerdict:
    plan: kvplan.KVPlan
    budget: kvplan.Budget
    pool_source: str  # "data" (--kv-cache-memory-bytes) or "estimate" (vLLM auto-sizes)
    problems: list[str]

    def summary(self) -> str:
        gib = kvplan.format_gib
        p, b = self.plan, self.budget
        return (
            f"KV pool {gib(p.kv_cache_memory_bytes)} GiB ({self.pool_source}): block size "
            f"{p.block_size}, {p.num_blocks:,} blocks, GPU KV cache size {p.tokens:,} tokens, "
            f"maximum concurrency {p.max_concurrency:.2f}x at {p.max_model_len:,} tokens; weights "
            f"{gib(b.weights_bytes)} + pool {gib(b.kv_cache_memory_bytes)} + overhead "
            f"{gib(b.overhead_bytes)} = {gib(b.total_bytes)} of {gib(b.usable_memory_bytes)} "
            f"GiB usable"
        )


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
    plan = kvplan.plan_kv(
        config, data["max_model_len"], pool, block_alignment=data["kv_block_alignment"]
    )
    bud = kvplan.budget(
        weights_bytes, pool, usable_memory_bytes=usable_bytes, overhead_bytes=overhead
    )
    gib = kvplan.format_gib
    problems = []
    if not plan.fits:
        hint = (
            f"; it holds at most {plan.estimated_max_model_len:,} tokens per request"
            if plan.estimated_max_model_len
            else ""
        )
        problems.append(
            f"vLLM would refuse to start: one {plan.max_model_len:,}-token request needs "
            f"{gib(plan.needed_bytes)} GiB ({plan.needed_bytes:,} bytes) of KV cache, the pool is "
            f"{gib(pool)} GiB ({pool:,} bytes){hint}; raise kv_cache_memory_bytes or lower "
            f"max_model_len"
        )
    if not bud.fits:
        problems.append(
            f"weights {gib(bud.weights_bytes)} + KV pool {gib(pool)} + overhead "
            f"{gib(overhead)} = {gib(bud.total_bytes)} GiB > {gib(usable_bytes)} GiB usable "
            f"(short by {gib(bud.total_bytes - usable_bytes)} GiB); lower kv_cache_memory_bytes "
            f"or set usable_memory_bytes to what this host really has"
        )
    return MemoryVerdict(plan, bud, source, problems)


def kv_expectation(config: dict, data) -> tuple[int, str] | None:
    """plan-kv's (tokens, concurrency "X.XX") that the engine must log, or None when the pool
    is auto-sized (nothing exact to compare)."""
    pool = data.get("kv_cache_memory_bytes")
    if pool is None:
        return None
    plan = kvplan.plan_kv(
        config, data["max_model_len"], pool, block_alignment=data["kv_block_alignment"]
    )
    return plan.tokens, f"{plan.max_concurrency:.2f}"
