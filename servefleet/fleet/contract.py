"""The data contract: every knob servefleet reads, declared once.

A declaration (servefleet.core.knobs.Knob) holds the knob's name, its check, the recipes
(deploys and verbs) that read it, whether it changes what serves (part of a release's data
digest) and its scope. The knobs every host shares are declared here; each engine declares its
own (servefleet/engines/<name>/logic/knobs.py) and the contract is both. Defaults and the
one-line docs live beside the values operators edit, in group_data/*.py (all.py, one file per
node class and per engine; testbed-only knobs in group_data/testbed*.py); docs/knobs.md's knob
lists are generated from both (`servefleet knobs --markdown`) and tests/unit/test_contract.py
checks that every place agrees.
"""

from __future__ import annotations

from servefleet.core import sandbox, validate as c
from servefleet.core.knobs import (  # noqa: F401 (the contract's vocabulary, re-exported)
    BASE,
    BENCH,
    DEPOT,
    ENGINE,
    FLEET,
    MODEL,
    OPERATIONAL,
    REBUILD,
    ROLLBACK,
    ROLLOUT,
    SERVE,
    TESTBED,
    Knob,
)
from servefleet.engines import ENGINES
from servefleet.fleet import registry

_MODEL_INCLUDE = c.list_of(
    c.pattern("a glob pattern without spaces", r"[A-Za-z0-9._*?\[\]/-]+"), non_empty=True
)
# CMake's architecture list: "89", "90;121", "120a".
_CUDA_ARCHS = c.pattern(
    "a CUDA architecture list like 89 or 90;121", r"[0-9]{2,3}[af]?(;[0-9]{2,3}[af]?){0,7}"
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
SHARED: tuple[Knob, ...] = (
    # --- layout and the service account --------------------------------------------------------
    K("servefleet_root", c.DEDICATED_DIR, (BASE,), serving=True),
    K("servefleet_user", c.ACCOUNT, (BASE,), serving=True),
    K("models_root", c.optional(c.DEDICATED_DIR), (BASE,), serving=True),
    # --- preflight -----------------------------------------------------------------------------
    K("require_gpu", c.BOOL, (BASE,)),
    K("min_driver_version", c.integer(1, 100000), (BASE,)),
    K("expected_arch", c.optional(c.one_of("x86_64", "aarch64")), (BASE,)),
    K("min_free_disk_bytes", c.size(0, c.BYTES_MAX), (BASE,)),
    K("model_min_free_disk_bytes", c.size(0, c.BYTES_MAX), (BASE,), per_engine=True),
    K("usable_memory_bytes", c.optional(c.size(1, c.BYTES_MAX)), ()),
    K("memory_model", c.one_of("unified", "discrete"), ()),
    K("gpu_memory_bytes", c.optional(c.size(1, c.BYTES_MAX)), ()),
    K("cuda_architectures", c.optional(_CUDA_ARCHS), (), serving=True),
    # --- OS packages and Python ----------------------------------------------------------------
    K("os_packages", c.dict_of(c.NAME, c.list_of(c.NAME)), (BASE,)),
    K("python_interpreter", c.dict_of(c.NAME, c.TEXT), (BASE,)),
    K("uv_version", c.VERSION, (BASE,)),
    K("pip_index_url", c.optional(c.URL), (BASE,)),
    K("pip_extra_index_urls", c.list_of(c.URL), (BASE,)),
    K("pip_find_links", c.list_of(c.TEXT), (BASE,)),
    K("python_no_deps", c.BOOL, (BASE,)),
    # --- service (both serving recipes) --------------------------------------------------------
    K("service_state", c.one_of("running", "stopped"), (SERVE, ROLLOUT), serving=True),
    K("service_enabled", c.BOOL, (SERVE,), serving=True),
    K("service_host", c.IP, (SERVE, BENCH), serving=True),
    K("service_port", c.integer(1, 65535), (SERVE, BENCH), serving=True, per_engine=True),
    K("api_key_file", c.optional(_FILE), (SERVE, BENCH)),
    K(
        "served_model_name",
        c.optional(c.SERVED_NAME),
        (SERVE, BENCH),
        serving=True,
        required_by=(SERVE,),
        per_engine=True,
    ),
    K("service_syscall_filter", _SYSCALL_FILTER, (SERVE,), serving=True),
    K("health_timeout_s", c.integer(1, c.SECONDS_MAX), (SERVE, ROLLOUT)),
    K("health_settle_s", c.integer(0, 86400), (SERVE, ROLLOUT)),
    K("releases_keep", c.integer(1, 100), (SERVE, ROLLOUT)),
    K("metrics_textfile_dir", c.optional(c.ABS_PATH), (SERVE, ROLLOUT, ROLLBACK, REBUILD)),
    # --- the rollout's performance gate (servefleet.core.perf) ---------------------------------
    K("perf_gate", c.BOOL, (ROLLOUT,)),
    K("perf_gate_runs", c.integer(1, 100), (ROLLOUT, BENCH)),
    K("perf_gate_prompt_tokens", c.integer(1, c.TOKENS_MAX), (ROLLOUT, BENCH)),
    K("perf_gate_max_tokens", c.integer(2, c.TOKENS_MAX), (ROLLOUT, BENCH)),
    K("perf_gate_decode_drop_pct", c.optional(c.integer(1, 100)), (ROLLOUT, BENCH)),
    K("perf_gate_ttft_rise_pct", c.optional(c.integer(1, 10000)), (ROLLOUT, BENCH)),
    K("perf_gate_recheck_pct", c.integer(0, 100), (ROLLOUT,)),
    # --- models --------------------------------------------------------------------------------
    K("hf_endpoint", c.URL, (SERVE, DEPOT, MODEL)),
    K("hf_token_file", c.optional(_FILE), (SERVE, DEPOT, MODEL)),
    K("model_source", c.one_of("hub", "depot"), (SERVE, MODEL)),
    K("depot_host", c.optional(c.NAME), (SERVE, MODEL)),
    K("huggingface_hub_version", c.VERSION, (SERVE, DEPOT, MODEL)),
    K("download_margin_bytes", c.size(0, c.BYTES_MAX), (SERVE, DEPOT, MODEL)),
    K("hub_timeout_seconds", c.integer(1, 3600), (SERVE, DEPOT, MODEL)),
    K(
        "model_repo",
        c.optional(c.REPO_ID),
        (SERVE, MODEL),
        serving=True,
        required_by=(SERVE, MODEL),
        per_engine=True,
    ),
    K("model_revision", c.REVISION, (SERVE, MODEL), serving=True),
    K("model_include", _MODEL_INCLUDE, (MODEL,), serving=True),
    # --- the depot -----------------------------------------------------------------------------
    K("depot_user", c.ACCOUNT, (DEPOT, SERVE, MODEL)),
    K("depot_address", c.optional(_HOST_ADDRESS), (DEPOT, SERVE, MODEL)),
    K("depot_ssh_key", c.optional(_FILE), (DEPOT, SERVE, MODEL)),
    K("depot_bwlimit_kib", c.optional(c.integer(1, 2**40)), (SERVE, MODEL)),
    K("depot_store", c.optional(c.DEDICATED_DIR), (DEPOT, SERVE, MODEL)),
    K("depot_models", _DEPOT_MODEL, (DEPOT,)),
    # --- the roofline of `servefleet bench` (the node class's bandwidth, the model's bytes) -----
    K("memory_bandwidth_bytes_per_s", c.optional(c.size(1, c.BYTES_MAX)), (BENCH,)),
    K("bytes_per_token", c.optional(c.size(1, c.BYTES_MAX)), (BENCH,), per_engine=True),
    # --- operational: set by a verb, not by operators ------------------------------------------
    K("purge_models", c.BOOL, (REBUILD,), scope=OPERATIONAL),
    K("previous_release", c.BOOL, (ROLLBACK,), scope=OPERATIONAL),
)

KNOBS: tuple[Knob, ...] = SHARED + tuple(k for e in ENGINES for k in e.knobs)
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
# The engine that declares each of its own knobs.
OWNER = {k.name: e for e in ENGINES for k in e.knobs}
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


def _labels(knob: Knob, labels: tuple[str, ...]) -> list[str]:
    """Labels with SERVE (every engine's deploy) and ENGINE (the declaring engine's) resolved."""
    out: list[str] = []
    for label in labels:
        if label == SERVE:
            out += registry.serving_deploys()
        elif label == ENGINE:
            out.append(OWNER[knob.name].deploy)
        else:
            out.append(label)
    return out


def readers(knob: Knob) -> list[str]:
    """The deploys and verbs that read a knob: the serving deploys first, then the others."""
    found = _labels(knob, knob.recipes)
    found += [e.deploy for e in ENGINES if knob.name in e.reads]
    serving = registry.serving_deploys()
    return [r for r in serving if r in found] + [r for r in found if r not in serving]


def required(knob: Knob, recipe: str | None) -> bool:
    """Is None no value of this knob for deploys/<recipe>.py?"""
    return recipe is not None and recipe in _labels(knob, knob.required_by)


def fetches_model(recipe: str | None) -> bool:
    """Does deploys/<recipe>.py put a model on the node (the serving ones and model.py)?"""
    return recipe in (*registry.serving_deploys(), MODEL)
