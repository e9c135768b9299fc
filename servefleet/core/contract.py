"""The data contract: every knob servefleet reads, declared once.

A declaration holds the knob's name, its check, the recipes (deploys and verbs) that read it,
whether it changes what serves (part of a release's data digest) and its scope. Defaults and the
one-line docs live beside the values operators edit, in group_data/*.py (all.py and the role
files; testbed-only knobs in group_data/testbed*.py); docs/knobs.md's knob lists are generated
from both (`servefleet knobs --markdown`) and tests/unit/test_contract.py checks that every place
agrees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servefleet.core import sandbox, validate as c

# Recipe labels: deploys/<name>.py, and the verbs that read data of their own.
BASE, BF16, Q4, DEPOT, MODEL = "base", "serve_bf16", "serve_q4_llamacpp", "depot", "model"
BENCH, REBUILD, ROLLOUT, ROLLBACK = "bench", "rebuild", "rollout", "rollback"
SERVING = (BF16, Q4)
ALL_DEPLOYS = (BASE, BF16, Q4, DEPOT, MODEL, ROLLBACK)
# Which role a serving deploy acts on (the inventory group of that name).
ROLE_OF = {BF16: "spark", Q4: "rtx4090", DEPOT: "depot"}

FLEET, OPERATIONAL, TESTBED = "fleet", "operational", "testbed"


@dataclass(frozen=True)
class Knob:
    name: str
    check: c.Check
    recipes: tuple[str, ...]
    serving: bool = False  # changes what serves: part of a release's data digest
    scope: str = FLEET  # fleet | operational (set by a verb) | testbed (testbed hosts only)
    required_by: tuple[str, ...] = ()  # recipes for which None is not a value


_MODEL_INCLUDE = c.list_of(
    c.pattern("a glob pattern without spaces", r"[A-Za-z0-9._*?\[\]/-]+"), non_empty=True
)
_CMAKE_VAR = c.pattern("a CMake variable name", r"[A-Za-z_][A-Za-z0-9_]*")
_CMAKE_VALUE = c.pattern("a value of letters, digits and '._-+;,:='", r"[A-Za-z0-9._+;,:=-]+")
# CMake variables whose value CMake runs or includes (a launcher list `sh;-c;...`, a compiler, a
# toolchain or include file) are root's to choose, not data's; `;` (a CMake list) only in the
# architecture lists.
_CMAKE_RUNS = re.compile(
    r"CMAKE_\w*(LAUNCHER|COMPILER\w*|LINKER\w*|TOOLCHAIN_FILE|INCLUDE\w*)|"
    r"\w*_COMMAND|\w*_EXECUTABLE"
)
_CMAKE_FLAGS = c.Check(
    "{CMake variable: value} without variables CMake runs or includes (*_LAUNCHER, *_COMPILER, "
    "*_TOOLCHAIN_FILE, *_INCLUDE*, *_COMMAND, *_EXECUTABLE); ';' only in *_ARCHITECTURES",
    lambda v: (
        c.dict_of(_CMAKE_VAR, _CMAKE_VALUE).ok(v)
        and all(
            not _CMAKE_RUNS.fullmatch(k) and (";" not in val or k.endswith("_ARCHITECTURES"))
            for k, val in v.items()
        )
    ),
)
_GIT_URL = c.Check(
    "a git URL (https://, ssh://, git://, file://) or an absolute path, without spaces",
    lambda v: (
        c.clean_abs_path(v)
        or (
            isinstance(v, str)
            and re.fullmatch(r"(https?|ssh|git|file)://[A-Za-z0-9._~:/@%+-]+", v) is not None
        )
    ),
)
_GGUF_FILE = c.pattern(
    "a .gguf file name (letters, digits, '._-')", r"[A-Za-z0-9][A-Za-z0-9._-]*\.gguf"
)
_HOST_ADDRESS = c.pattern("an IP address or host name", r"[A-Za-z0-9][A-Za-z0-9.:-]*")
_DEPOT_MODEL = c.Check(
    'a list of {"repo_id": "org/name", "revision": "main" or a sha, "include": [globs]}',
    lambda v: (
        isinstance(v, (list, tuple))
        and all(
            isinstance(m, dict)
            and set(m) <= {"repo_id", "revision", "include"}
            and c.REPO_ID.ok(m.get("repo_id"))
            and (m.get("revision") is None or c.REVISION.ok(m["revision"]))
            and (m.get("include") is None or _MODEL_INCLUDE.ok(m["include"]))
            for m in v
        )
    ),
)
# SystemCallFilter= words: an allow list (the first word allows), `~` words remove from it.
_SYSCALL_FILTER = c.Check(
    'a list of system-call groups or names, the first an allow ("@system-service"), '
    'then removals ("~@privileged")',
    lambda v: (
        isinstance(v, (list, tuple))
        and len(v) > 0
        and all(isinstance(w, str) and sandbox.SYSCALL_WORD.fullmatch(w) for w in v)
        and not v[0].startswith("~")
    ),
)
_FILE = c.Check("a path of a file on the operator's machine (no spaces)", c.safe_text)

K = Knob
KNOBS: tuple[Knob, ...] = (
    # --- layout and the service account --------------------------------------------------------
    K("servefleet_root", c.DEDICATED_DIR, (BASE,), serving=True),
    K("servefleet_user", c.ACCOUNT, (BASE,), serving=True),
    K("models_root", c.optional(c.DEDICATED_DIR), (BASE,), serving=True),
    # --- preflight -----------------------------------------------------------------------------
    K("require_gpu", c.BOOL, (BASE,)),
    K("min_driver_version", c.integer(1, 100000), (BASE,)),
    K("expected_arch", c.optional(c.one_of("x86_64", "aarch64")), (BASE,)),
    K("min_free_disk_bytes", c.size(0, c.BYTES_MAX), (BASE,)),
    K("usable_memory_bytes", c.optional(c.size(1, c.BYTES_MAX)), (BF16,)),
    # --- OS packages and Python ----------------------------------------------------------------
    K("os_packages", c.dict_of(c.NAME, c.list_of(c.NAME)), (BASE,)),
    K("python_interpreter", c.dict_of(c.NAME, c.TEXT), (BASE,)),
    K("uv_version", c.VERSION, (BASE,)),
    K("pip_index_url", c.optional(c.URL), (BASE,)),
    K("pip_extra_index_urls", c.list_of(c.URL), (BASE,)),
    K("pip_find_links", c.list_of(c.TEXT), (BASE,)),
    K("python_no_deps", c.BOOL, (BASE,)),
    # --- service (both serving recipes) --------------------------------------------------------
    K("service_state", c.one_of("running", "stopped"), SERVING + (ROLLOUT,), serving=True),
    K("service_enabled", c.BOOL, SERVING, serving=True),
    K("service_host", c.IP, SERVING + (BENCH,), serving=True),
    K("service_port", c.integer(1, 65535), SERVING + (BENCH,), serving=True),
    K("api_key_file", c.optional(_FILE), SERVING + (BENCH,)),
    K(
        "served_model_name",
        c.optional(c.SERVED_NAME),
        SERVING + (BENCH,),
        serving=True,
        required_by=SERVING,
    ),
    K("service_syscall_filter", _SYSCALL_FILTER, SERVING, serving=True),
    K("health_timeout_s", c.integer(1, c.SECONDS_MAX), SERVING + (ROLLOUT,)),
    K("health_settle_s", c.integer(0, 86400), SERVING + (ROLLOUT,)),
    K("releases_keep", c.integer(1, 100), SERVING + (ROLLOUT,)),
    # --- the rollout's performance gate (servefleet.core.perf) ---------------------------------
    K("perf_gate", c.BOOL, (ROLLOUT,)),
    K("perf_gate_runs", c.integer(1, 100), (ROLLOUT, BENCH)),
    K("perf_gate_prompt_tokens", c.integer(1, c.TOKENS_MAX), (ROLLOUT, BENCH)),
    K("perf_gate_max_tokens", c.integer(2, c.TOKENS_MAX), (ROLLOUT, BENCH)),
    K("perf_gate_decode_drop_pct", c.optional(c.integer(1, 100)), (ROLLOUT, BENCH)),
    K("perf_gate_ttft_rise_pct", c.optional(c.integer(1, 10000)), (ROLLOUT, BENCH)),
    K("perf_gate_recheck_pct", c.integer(0, 100), (ROLLOUT,)),
    # --- models --------------------------------------------------------------------------------
    K("hf_endpoint", c.URL, (BF16, Q4, DEPOT, MODEL)),
    K("hf_token_file", c.optional(_FILE), (BF16, Q4, DEPOT, MODEL)),
    K("model_source", c.one_of("hub", "depot"), (BF16, Q4, MODEL)),
    K("depot_host", c.optional(c.NAME), (BF16, Q4, MODEL)),
    K("huggingface_hub_version", c.VERSION, (BF16, Q4, DEPOT, MODEL)),
    K("download_margin_bytes", c.size(0, c.BYTES_MAX), (BF16, Q4, DEPOT, MODEL)),
    K("hub_timeout_seconds", c.integer(1, 3600), (BF16, Q4, DEPOT, MODEL)),
    K(
        "model_repo",
        c.optional(c.REPO_ID),
        (BF16, Q4, MODEL),
        serving=True,
        required_by=(BF16, Q4, MODEL),
    ),
    K("model_revision", c.REVISION, (BF16, Q4, MODEL), serving=True),
    K("model_include", _MODEL_INCLUDE, (BF16, MODEL), serving=True),
    K("model_file", c.optional(_GGUF_FILE), (Q4,), serving=True, required_by=(Q4,)),
    # --- the depot -----------------------------------------------------------------------------
    K("depot_user", c.ACCOUNT, (DEPOT, BF16, Q4, MODEL)),
    K("depot_address", c.optional(_HOST_ADDRESS), (DEPOT, BF16, Q4, MODEL)),
    K("depot_ssh_key", c.optional(_FILE), (DEPOT, BF16, Q4, MODEL)),
    K("depot_bwlimit_kib", c.optional(c.integer(1, 2**40)), (BF16, Q4, MODEL)),
    K("depot_store", c.optional(c.DEDICATED_DIR), (DEPOT, BF16, Q4, MODEL)),
    K("depot_models", _DEPOT_MODEL, (DEPOT,)),
    # --- DGX Spark, BF16 vLLM ------------------------------------------------------------------
    K("vllm_version", c.VERSION, (BF16,), serving=True),
    K("torch_version", c.VERSION, (BF16,), serving=True),
    K("torch_cuda", c.pattern("a CUDA version like 13.0", r"\d+\.\d+"), (BF16,), serving=True),
    K("uv_cache_dir", c.optional(c.ABS_PATH), (BF16,)),
    K("vllm_patch", c.BOOL, (BF16,), serving=True),
    K("language_model_only", c.BOOL, (BF16,), serving=True),
    K("trust_remote_code", c.BOOL, (BF16,), serving=True),
    K("max_model_len", c.integer(1, c.TOKENS_MAX), (BF16,), serving=True),
    K("kv_cache_memory_bytes", c.optional(c.size(1, c.BYTES_MAX)), (BF16,), serving=True),
    K("kv_block_alignment", c.integer(1, 2**20), (BF16,)),
    K("memory_overhead_bytes", c.size(0, c.BYTES_MAX), (BF16,)),
    K("page_cache_policy", c.one_of("auto", "always", "never"), (BF16,)),
    K("page_cache_drop_global", c.BOOL, (BF16,)),
    K("vllm_extra_args", c.list_of(c.ARG), (BF16,), serving=True),
    K("memory_bandwidth_bytes_per_s", c.optional(c.size(1, c.BYTES_MAX)), (BENCH,)),
    K("bytes_per_token", c.optional(c.size(1, c.BYTES_MAX)), (BENCH,)),
    # --- RTX 4090, llama.cpp -------------------------------------------------------------------
    K("llamacpp_git_url", _GIT_URL, (Q4,)),
    K("llamacpp_tag", c.NAME, (Q4,), serving=True),
    K("llamacpp_commit", c.SHA, (Q4,), serving=True),
    K("llamacpp_cmake_flags", _CMAKE_FLAGS, (Q4,), serving=True),
    K("llamacpp_ccache", c.BOOL, (Q4,)),
    K("llamacpp_ccache_dir", c.optional(c.ABS_PATH), (Q4,)),
    K("llamacpp_build_jobs", c.optional(c.integer(1, c.JOBS_MAX)), (Q4,)),
    K("llamacpp_build_min_free_disk_bytes", c.size(0, c.BYTES_MAX), (Q4,)),
    K("llamacpp_min_nvcc_version", c.pattern("a version like 13.0", r"\d+(\.\d+)*"), (Q4,)),
    K("llamacpp_build_packages", c.dict_of(c.NAME, c.list_of(c.NAME)), (Q4,)),
    K("llamacpp_gguf_version", c.VERSION, (Q4,)),
    K("llamacpp_gguf_overrides", c.BOOL, (Q4,), serving=True),
    K("llamacpp_context", c.integer(1, c.TOKENS_MAX), (Q4,), serving=True),
    K("llamacpp_context_bytes", c.size(0, c.BYTES_MAX), (Q4,), serving=True),
    K("llamacpp_ram_reserve_bytes", c.size(0, c.BYTES_MAX), (Q4,), serving=True),
    K("llamacpp_server_args", c.list_of(c.ARG), (Q4,), serving=True),
    # --- operational: set by a verb, not by operators ------------------------------------------
    K("purge_models", c.BOOL, (REBUILD,), scope=OPERATIONAL),
    K("previous_release", c.BOOL, (ROLLBACK,), scope=OPERATIONAL),
    # --- testbed only: refused on any host outside the testbed ---------------------------------
    K("vllm_executable", c.optional(c.ABS_PATH), (BF16,), serving=True, scope=TESTBED),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
assert len(BY_NAME) == len(KNOBS), "a knob is declared twice"

# pyinfra's own data keys (connectors, global-argument defaults) are not servefleet knobs.
PYINFRA_PREFIXES = (
    "_",
    "ssh_",
    "local_",
    "docker_",
    "winrm_",
    "vagrant_",
    "terraform_",
    "chroot_",
    "podman_",
)


def is_pyinfra_key(key: str) -> bool:
    return key.startswith(PYINFRA_PREFIXES)


def serving_keys() -> list[str]:
    return [k.name for k in KNOBS if k.serving]
