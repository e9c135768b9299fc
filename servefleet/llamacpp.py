"""The llama.cpp Q4 recipe (deploys/serve_q4_llamacpp.py): its data keys, pure logic and steps.

Each step reads its values from host.data (checked by `KEYS` before any step runs) and calls the
operations of servefleet/operations/llamacpp.py:

    build_packages()  build-essential, cmake, git, ccache (per OS family, from data)
    build()           llama-server at the pinned commit into ROOT/llama.cpp/<tag>-<hash>/, then
                      `current` switched to it and old builds pruned; nothing when it is there
    model()           the GGUF (servefleet.models.ensure_model)
    gguf_lint()       gguf in the tools venv, the lint script on the node, the file linted
    service()         servefleet-llama.service from files/llamacpp/, --override-kv from the lint
    health()          /health and one chat completion, only when the service (re)started
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, pip

from servefleet import schema
from servefleet.operations import llamacpp as ops
from servefleet.paths import REPO_ROOT

UNIT = "servefleet-llama.service"
UNIT_TEMPLATE = REPO_ROOT / "files" / "llamacpp" / "servefleet-llama.service.j2"
PREFLIGHT_SCRIPT = REPO_ROOT / "files" / "llamacpp" / "llama-preflight.sh"
LINT_SCRIPT = REPO_ROOT / "servefleet" / "lint" / "gguf_lint.py"

_GIT_URL = schema.Check(
    "a git URL (https://, ssh://, git://, file://, user@host:path) or an absolute path",
    lambda v: isinstance(v, str) and re.match(r"^(https?|ssh|git|file)://\S+$|^/\S*$|^[\w.-]+@[\w.-]+:\S+$", v) is not None)
_SHA = schema.Check("a 40-hex git commit sha",
                    lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{40}", v) is not None)
_CMAKE_VAR = schema.Check("a CMake variable name",
                          lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) is not None)
_CMAKE_VALUE = schema.Check("a value without spaces or quotes",
                            lambda v: isinstance(v, str) and re.fullmatch(r"[^\s'\"\\$`]+", v) is not None)
_VERSION = schema.Check("a version like 13.0",
                        lambda v: isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)*", v) is not None)
_GGUF_FILE = schema.Check("a .gguf file name in the repo",
                          lambda v: isinstance(v, str) and re.fullmatch(r"[\w./-]+\.gguf", v) is not None
                          and ".." not in v)
_ARG = schema.Check("a string without whitespace, quotes or '%'",
                    lambda v: isinstance(v, str) and re.fullmatch(r"[^\s'\"\\%]+", v) is not None)

# The recipe's own keys (defaults and one-line comments: group_data/rtx4090.py).
KEYS = {
    "llamacpp_git_url": _GIT_URL,
    "llamacpp_tag": schema.NAME,
    "llamacpp_commit": _SHA,
    "llamacpp_cmake_flags": schema.dict_of(_CMAKE_VAR, _CMAKE_VALUE),
    "llamacpp_ccache": schema.BOOL,
    "llamacpp_ccache_dir": schema.optional(schema.ABS_PATH),
    "llamacpp_build_jobs": schema.optional(schema.integer(1)),
    "llamacpp_keep_builds": schema.integer(1),
    "llamacpp_build_min_free_disk_bytes": schema.integer(0),
    "llamacpp_min_nvcc_version": _VERSION,
    "llamacpp_build_packages": schema.dict_of(schema.NAME, schema.list_of(schema.NAME)),
    "llamacpp_gguf_version": _VERSION,
    "llamacpp_context": schema.integer(1),
    "llamacpp_context_bytes": schema.integer(0),
    "llamacpp_ram_reserve_bytes": schema.integer(0),
    "llamacpp_gguf_overrides": schema.BOOL,
    "llamacpp_server_args": schema.list_of(_ARG),
    "model_repo": schema.REPO_ID,
    "model_revision": schema.REVISION,
    "model_file": _GGUF_FILE,
    "served_model_name": _ARG,
    "health_timeout_s": schema.integer(1),
}


def validate_data() -> None:
    """Stop the whole run before any change if this host's data is missing or malformed."""
    from servefleet.base import validate_data as base_validate

    base_validate(extra=KEYS)


# --- Pure logic (unit-tested) ------------------------------------------------------------------

def cuda_on(flags: dict) -> bool:
    return str(flags.get("GGML_CUDA", "OFF")).upper() in ("ON", "1", "TRUE", "YES", "Y")


def flags_hash(commit: str, flags: dict) -> str:
    """What identifies a build besides its tag: the commit and the CMake flags."""
    text = json.dumps({"commit": commit, "cmake_flags": flags}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_name(data) -> str:
    """The build's prefix name: <tag>-<hash of commit + flags>, e.g. b9784-3f2a9c0d41be."""
    return f"{data['llamacpp_tag']}-{flags_hash(data['llamacpp_commit'], data['llamacpp_cmake_flags'])}"


def launcher_args(data) -> list[str]:
    """ccache as the compiler launcher (C, C++ and CUDA); not part of the build's identity."""
    if not data["llamacpp_ccache"]:
        return []
    langs = ["C", "CXX"] + (["CUDA"] if cuda_on(data["llamacpp_cmake_flags"]) else [])
    return [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in langs]


def llama_dir(data) -> str:
    return ops.llama_dir(data["servefleet_root"])


def binary(data) -> str:
    """The llama-server the service runs: always through `current`."""
    return f"{llama_dir(data)}/current/bin/llama-server"


def model_dir(data) -> str:
    """Where the GGUF's repo lives on the node: {root}/models/{org}/{name}."""
    return f"{data['servefleet_root']}/models/{data['model_repo']}"


def model_path(data) -> str:
    return f"{model_dir(data)}/{data['model_file']}"


def api_key_path(data) -> str:
    return f"{data['servefleet_root']}/etc/llama-api-key"


def lint_script(data) -> str:
    return f"{data['servefleet_root']}/tools/gguf_lint.py"


def lint_python(data) -> str:
    return f"{data['servefleet_root']}/tools/venv/bin/python"


def check_host(data) -> str:
    """Where health checks on the node reach the API (a wildcard bind is reached on loopback)."""
    bind = data["service_host"]
    if bind in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{bind}]" if ":" in bind else bind


def override_kv(data) -> str | None:
    """The --override-kv value for the unit, read from the GGUF lint on the node *now*.

    Called while the unit template renders: before execution (for change detection) and again
    during execution, after the download, so the first run already gets the right flag.
    """
    if not data["llamacpp_gguf_overrides"]:
        return None
    lint = host.get_fact(ops.GgufLint, python=lint_python(data), script=lint_script(data),
                         path=model_path(data))
    return lint.flag if lint.state == "ok" else None


def unit_context(data, override_kv) -> dict:
    """Variables of files/llamacpp/servefleet-llama.service.j2; override_kv: () -> str | None."""
    root = data["servefleet_root"]
    return {
        # not `user`: files.template takes that as the unit file's owner
        "service_user": data["servefleet_user"], "root": root, "binary": binary(data),
        "model": model_path(data), "ctx": data["llamacpp_context"],
        "bind_host": data["service_host"], "port": data["service_port"],
        "alias": data["served_model_name"],
        "api_key_file": api_key_path(data) if data.get("api_key_file") else None,
        "extra_args": list(data["llamacpp_server_args"]),
        "preflight": preflight_path(data), "context_bytes": data["llamacpp_context_bytes"],
        "ram_reserve": data["llamacpp_ram_reserve_bytes"], "gpu": data["require_gpu"],
        "override_kv": override_kv,
    }


def read_api_key(path: str, host_name: str) -> str:
    """The operator-side API key; an unreadable or empty file is bad data (nothing changed)."""
    try:
        key = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise schema.DataError(f"invalid data for host {host_name}: api_key_file {path!r} cannot "
                               f"be read ({exc.strerror}); nothing was changed") from None
    if not key or any(c.isspace() for c in key):
        raise schema.DataError(f"invalid data for host {host_name}: api_key_file {path!r} must "
                               "hold one key without spaces; nothing was changed")
    return key


def preflight_path(data) -> str:
    return f"{data['servefleet_root']}/bin/llama-preflight"


# --- Steps of the recipe (read top to bottom by deploys/serve_q4_llamacpp.py) ------------------

@dataclass
class Build:
    name: str
    build: object  # OperationMeta: built in this run
    switch: object  # OperationMeta: `current` moved in this run (the service's dependency)


@deploy("llama.cpp build packages")
def build_packages():
    from servefleet.base import _per_family
    from servefleet.operations import node

    node.os_packages(name="Install llama.cpp build packages",
                     packages=_per_family("llamacpp_build_packages"))


@deploy("llama.cpp build")
def build() -> Build:
    data = host.data.dict()
    root, name = data["servefleet_root"], build_name(data)
    flags = data["llamacpp_cmake_flags"]
    made = ops.build(
        name=f"Build llama-server {data['llamacpp_tag']} ({data['llamacpp_commit'][:10]}) -> {name}",
        root=root, build=name, git_url=data["llamacpp_git_url"], commit=data["llamacpp_commit"],
        tag=data["llamacpp_tag"], cmake_flags=flags,
        flags_hash=flags_hash(data["llamacpp_commit"], flags), launcher_args=launcher_args(data),
        jobs=data.get("llamacpp_build_jobs"), ccache_dir=data.get("llamacpp_ccache_dir"),
        min_free_disk=data["llamacpp_build_min_free_disk_bytes"],
        min_nvcc=data["llamacpp_min_nvcc_version"] if cuda_on(flags) else None)
    switch = ops.switch(name=f"llama.cpp current -> {name}", root=root, build=name)
    ops.prune(name=f"Keep {data['llamacpp_keep_builds']} llama.cpp build(s)", root=root,
              keep=data["llamacpp_keep_builds"], keep_names=[name])
    return Build(name=name, build=made, switch=switch)


@deploy("Model")
def model():
    """The GGUF on the node (servefleet.models.ensure_model: hub or depot, as data says)."""
    from servefleet.models import ensure_model

    data = host.data.dict()
    return ensure_model(repo_id=data["model_repo"], revision=data["model_revision"],
                        include=[data["model_file"]], dest=model_dir(data))


@deploy("GGUF lint")
def gguf_lint():
    """gguf in the tools venv and the lint script on the node; the model file linted there."""
    from servefleet.python_env import install_args

    data = host.data.dict()
    version = data["llamacpp_gguf_version"]
    pip.packages(name=f"gguf {version} in the tools venv", packages=[f"gguf=={version}"],
                 virtualenv=f"{data['servefleet_root']}/tools/venv",
                 extra_install_args=install_args(data) or None)
    files.put(name="GGUF lint script", src=str(LINT_SCRIPT), dest=lint_script(data), mode="644")
    ops.check_gguf(name="GGUF lint of the model file", python=lint_python(data),
                   script=lint_script(data), path=model_path(data))


@deploy("llama.cpp service")
def service(built: Build, run, depends_on: list = ()):
    from servefleet.service import systemd_service

    data = host.data.dict()
    user = data["servefleet_user"]
    files.put(name="Start preflight script (free VRAM/RAM)", src=str(PREFLIGHT_SCRIPT),
              dest=preflight_path(data), mode="755")
    key_file = api_key_path(data)
    if data.get("api_key_file"):
        key = read_api_key(data["api_key_file"], host.name)
        key_op = files.put(name=f"API key -> {key_file} (0600)", src=StringIO(key + "\n"),
                           dest=key_file, user=user, group=user, mode="600")
    else:
        key_op = files.file(name=f"No API key file ({key_file})", path=key_file, present=False)
    # Positional: `name=` would be taken by pyinfra as the deploy's display name.
    return systemd_service(
        UNIT, str(UNIT_TEMPLATE),
        # override_kv is called while the template renders, also at execution time: the lint of
        # the file downloaded in this very run.
        unit_context(data, override_kv=lambda: override_kv(data)),
        depends_on=[built.build, built.switch, run, key_op, *depends_on],
    )


@deploy("llama.cpp health")
def health(svc):
    """Only when the service was (re)started in this run: /health, then one chat completion."""
    data = host.data.dict()
    base_url = f"http://{check_host(data)}:{data['service_port']}"
    ops.wait_healthy(name=f"Wait for {base_url}/health", url=f"{base_url}/health", unit=UNIT,
                     timeout_s=data["health_timeout_s"], _if=svc.started)
    ops.smoke_chat(name="One chat completion (smoke test)", url=f"{base_url}/v1/chat/completions",
                   model=data["served_model_name"],
                   api_key_file=api_key_path(data) if data.get("api_key_file") else None,
                   _if=svc.started)
