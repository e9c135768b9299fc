"""llama.cpp's knobs (defaults and docs: group_data/llamacpp.py) and the server flags the recipe
sets from them, which llamacpp_server_args may not set again (servefleet.core.owned_flags)."""

from __future__ import annotations

import re

from servefleet.core import validate as c
from servefleet.core.knobs import ENGINE, Knob as K

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
OWN = (ENGINE,)

KNOBS = (
    K("model_file", c.optional(_GGUF_FILE), OWN, serving=True, required_by=OWN),
    K("llamacpp_git_url", _GIT_URL, OWN),
    K("llamacpp_tag", c.NAME, OWN, serving=True),
    K("llamacpp_commit", c.SHA, OWN, serving=True),
    K("llamacpp_cmake_flags", _CMAKE_FLAGS, OWN, serving=True),
    K("llamacpp_ccache", c.BOOL, OWN),
    K("llamacpp_ccache_dir", c.optional(c.ABS_PATH), OWN),
    K("llamacpp_build_jobs", c.optional(c.integer(1, c.JOBS_MAX)), OWN),
    K("llamacpp_build_min_free_disk_bytes", c.size(0, c.BYTES_MAX), OWN),
    K("llamacpp_min_nvcc_version", c.pattern("a version like 13.0", r"\d+(\.\d+)*"), OWN),
    K("llamacpp_build_packages", c.dict_of(c.NAME, c.list_of(c.NAME)), OWN),
    K("llamacpp_gguf_version", c.VERSION, OWN),
    K("llamacpp_gguf_overrides", c.BOOL, OWN, serving=True),
    K("llamacpp_context", c.integer(1, c.TOKENS_MAX), OWN, serving=True),
    K("llamacpp_context_bytes", c.size(0, c.BYTES_MAX), OWN, serving=True),
    K("llamacpp_ram_reserve_bytes", c.size(0, c.BYTES_MAX), OWN, serving=True),
    K("llamacpp_server_args", c.list_of(c.ARG), OWN, serving=True),
)

# llama-server takes the last of a repeated flag: each of these is rendered from the knob named
# beside it, so llamacpp_server_args may not set it again.
OWNED = {
    "--host": "service_host",
    "--port": "service_port",
    "--api-key": "api_key_file",
    "--api-key-file": "api_key_file",
    "-m": "model_file",
    "--model": "model_file",
    "-mu": "model_file",
    "--model-url": "model_file",
    "-hf": "model_file",
    "--hf-repo": "model_file",
    "-a": "served_model_name",
    "--alias": "served_model_name",
    "-c": "llamacpp_context",
    "--ctx-size": "llamacpp_context",
    "--override-kv": "the GGUF lint (llamacpp_gguf_overrides)",
}
