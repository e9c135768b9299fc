"""llama.cpp's pure logic: build identity, build records, preflights, the unit's values, the
sandbox probe, drift's build items. Unit-tested; the steps (servefleet.engines.llamacpp.steps),
the readers and drift call it."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from servefleet.core import drift_items as di, records, sandbox, systemd as sd
from servefleet.core.layout import LLAMA_UNIT, NodeLayout

UNIT = LLAMA_UNIT
TEMPLATE = "files/llamacpp/servefleet-llama.service.j2"
ENGINE = "llama.cpp"  # what its release records name
CREDENTIAL = "api-key"  # LoadCredential= name: systemd hands the key to the service user


def cuda_on(flags: dict) -> bool:
    """The one reading of GGML_CUDA (CMake's true values)."""
    return str(flags.get("GGML_CUDA", "OFF")).upper() in ("ON", "1", "TRUE", "YES", "Y")


def cmake_flags(data) -> dict:
    """The build's CMake flags: data's, and with CUDA the node class's GPU architecture
    (cuda_architectures) where the flags name none: the same engine data builds for any GPU."""
    flags = dict(data["llamacpp_cmake_flags"])
    arch = data.get("cuda_architectures")
    if cuda_on(flags) and arch and "CMAKE_CUDA_ARCHITECTURES" not in flags:
        flags["CMAKE_CUDA_ARCHITECTURES"] = arch
    return flags


def flags_hash(commit: str, flags: dict) -> str:
    """What identifies a build besides its tag: the commit and the CMake flags."""
    text = json.dumps({"commit": commit, "cmake_flags": flags}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_name(data) -> str:
    """The build's prefix name: <tag>-<hash of commit + flags>, e.g. b9784-3f2a9c0d41be."""
    return f"{data['llamacpp_tag']}-{flags_hash(data['llamacpp_commit'], cmake_flags(data))}"


def launcher_args(data) -> list[str]:
    """ccache as the compiler launcher (C, C++ and CUDA); not part of the build's identity."""
    if not data["llamacpp_ccache"]:
        return []
    langs = ["C", "CXX"] + (["CUDA"] if cuda_on(cmake_flags(data)) else [])
    return [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in langs]


def build_env(
    git_url: str,
    commit: str,
    tag: str,
    flags_hash: str,
    src_dir: str,
    build_dir: str,
    prefix: str,
    cmake_flags: dict,
    launcher_args=(),
    jobs: int | None = None,
    ccache_dir: str | None = None,
    nvcc: str | None = None,
) -> dict[str, str]:
    """The environment files/llamacpp/build.sh takes (its header names each variable)."""
    env = {
        "GIT_URL": git_url,
        "COMMIT": commit,
        "TAG": tag,
        "HASH": flags_hash,
        "SRC_DIR": src_dir,
        "BUILD_DIR": build_dir,
        "PREFIX": prefix,
        "CMAKE_ARGS": " ".join(f"-D{k}={v}" for k, v in sorted(cmake_flags.items())),
        "LAUNCHER_ARGS": " ".join(launcher_args),
        "FLAGS_JSON": json.dumps(cmake_flags, sort_keys=True),
        "JOBS": str(jobs) if jobs else "",  # empty: build.sh picks from CPUs and RAM
    }
    if ccache_dir:
        env["CCACHE_DIR"] = ccache_dir
    if nvcc:
        env["CUDACXX"] = nvcc
    return env


def model_path(model_dir: str, data) -> str:
    """The GGUF file inside the model's directory (its revision resolved to a commit)."""
    return f"{model_dir}/{data['model_file']}"


# --- build records -----------------------------------------------------------------------------


@dataclass
class Builds:
    """Installed builds (prefix name -> build.json record) and the target of `current`."""

    records: dict[str, dict] = field(default_factory=dict)
    current: str | None = None  # absolute path the link points to; None when there is no link

    @property
    def current_name(self) -> str | None:
        return self.current.rstrip("/").rsplit("/", 1)[-1] if self.current else None


def parse_builds(lines: list[str]) -> Builds:
    builds = Builds()
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "build":
            name, _, text = rest.partition(" ")
            try:
                record = records.load(text, f"build record {name}")
            except records.RecordError:
                continue  # a half-written (or a deep, or a twice-keyed) record is no build
            if isinstance(record, dict):
                builds.records[name] = record
        elif kind == "current" and rest.strip():
            builds.current = rest.strip()
    return builds


def build_present(builds: Builds, name: str, commit: str, cmake_flags: dict) -> bool:
    rec = builds.records.get(name)
    if not rec:
        return False
    return rec.get("commit") == commit and rec.get("cmake_flags") == cmake_flags


def parse_nvcc(lines: list[str]) -> dict | None:
    """{"path", "version"} from the fact's output: the path, then `nvcc --version`."""
    if not lines or not lines[0].strip():
        return None
    match = re.search(r"release (\d+\.\d+)", "\n".join(lines))
    return {"path": lines[0].strip(), "version": match.group(1) if match else None}


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text)))


def build_problems(
    *, cuda: bool, nvcc: dict | None, min_nvcc: str, free_disk: int, min_free_disk: int, root: str
) -> list[str]:
    """What stops a build on this node; [] when it can build."""
    problems = []
    if cuda:
        if not nvcc:
            problems.append(
                "GGML_CUDA=ON but no nvcc (not on PATH nor in /usr/local/cuda/bin): "
                "install the CUDA toolkit (an operator prerequisite), or set "
                "GGML_CUDA=OFF in llamacpp_cmake_flags"
            )
        elif not nvcc.get("version") or version_tuple(nvcc["version"]) < version_tuple(min_nvcc):
            problems.append(
                f"nvcc {nvcc.get('version') or '(unknown version)'} at {nvcc['path']} "
                f"is older than llamacpp_min_nvcc_version {min_nvcc}"
            )
    if free_disk < min_free_disk:
        problems.append(
            f"{free_disk / 1024**3:.1f} GiB free under {root}, a llama.cpp build "
            f"needs {min_free_disk / 1024**3:.1f} GiB (llamacpp_build_min_free_disk_bytes)"
        )
    return problems


# --- the GGUF lint on the node -----------------------------------------------------------------

# What the lint (run as the service user) may hand llama-server's --override-kv: KEY=int:N,
# N bounded as the lint bounds it (gguf_lint.MAX_BLOCK_INDEX + 1): never a 55-digit count.
_LINT_ITEM = r"[A-Za-z0-9_.-]{1,128}=int:(0|[1-9][0-9]{0,4})"
_LINT_FLAG = re.compile(rf"{_LINT_ITEM}(,{_LINT_ITEM}){{0,7}}")


@dataclass
class Lint:
    state: str  # ok | absent (no file) | nolint (no gguf in the tools venv yet) | error
    flag: str | None = None  # the --override-kv value when state is ok and there is a defect
    detail: str = ""


def parse_lint(lines: list[str]) -> Lint:
    text = "\n".join(lines).strip()
    state, _, rest = text.partition(" ")
    rest = rest.strip()
    if state == "ok":
        flag = rest or None
        if flag and not _LINT_FLAG.fullmatch(flag):
            return Lint("error", None, f"the lint printed an unexpected flag {flag[:200]!r}")
        return Lint("ok", flag)
    if state in ("absent", "nolint"):
        return Lint(state)
    return Lint("error", None, rest or text)


# --- the unit ------------------------------------------------------------------------------------


def unit_context(data, model_dir: str, override_kv) -> dict:
    """Variables of files/llamacpp/servefleet-llama.service.j2, every one escaped for systemd.

    model_dir: the model's directory on the node (its revision resolved to a commit).
    override_kv: () -> str | None, the GGUF lint's flag, read while the template renders (also
    at execution time, after this run's download).
    """
    lay = NodeLayout.of(data)
    build = build_name(data)
    model = model_path(model_dir, data)
    preflight = [
        lay.bin("servefleet-llama-preflight"),
        "--model",
        model,
        "--context-bytes",
        str(data["llamacpp_context_bytes"]),
        "--ram-reserve",
        str(data["llamacpp_ram_reserve_bytes"]),
    ]
    if data["require_gpu"]:
        preflight.append("--gpu")

    def exec_start() -> str:
        argv = [
            lay.llama_server(build),
            "-m",
            model,
            "--alias",
            data["served_model_name"],
            "-c",
            str(data["llamacpp_context"]),
            "--host",
            data["service_host"],
            "--port",
            str(data["service_port"]),
        ]
        if data.get("api_key_file"):
            argv += ["--api-key-file", sd.Specifier(f"%d/{CREDENTIAL}")]
        flag = override_kv() if data["llamacpp_gguf_overrides"] else None
        if flag:
            argv += ["--override-kv", flag]
        return sd.exec_line(argv + list(data["llamacpp_server_args"]))

    return {
        "service_user": sd.setting(data["servefleet_user"]),
        "working_directory": sd.setting(lay.cache_dir),
        "environment": [
            sd.environment("HOME", lay.cache_dir),
            sd.environment("GGML_CUDA_NO_PINNED", "1"),
            sd.environment("HF_HUB_OFFLINE", "1"),
        ],
        "credential": (
            f"{CREDENTIAL}:{sd.setting(lay.api_key_file)}" if data.get("api_key_file") else None
        ),
        "exec_start_pre": sd.exec_line(preflight),
        "exec_start": exec_start,  # called by the template: the lint is read at render time
        "description": sd.text(data["served_model_name"]),
        "sandbox": sandbox.properties(
            [lay.cache_dir],
            gpu=bool(data["require_gpu"]),
            memory_deny_write_execute=True,
            syscall_filter=data["service_syscall_filter"],
            hidden_paths=lay.engine_hidden_dirs,
        ),
        "gpu_setup": sandbox.gpu_setup_line() if data["require_gpu"] else None,
        "timeout_start_s": int(data["health_timeout_s"]),
    }


# `nvidia-smi -L` exits 0 with "No devices found." when /dev/nvidia0 is out of reach (seen on
# the H200 with the old allow list): the probe wants a GPU line.
NVIDIA_SMI_PROBE = (
    "nvidia-smi -L | grep '^GPU ' || { echo 'nvidia-smi -L lists no GPU' >&2; exit 1; }"
)


def probe_argv(data) -> list[str]:
    """What the sandbox probe runs before a (re)start (servefleet.core.sandbox). GPU node:
    nvidia-smi -L through the allowed devices, listing a GPU. Without a GPU: the llama-server
    the unit starts (its libraries loaded under W^X and the filter), asked for its version."""
    if data["require_gpu"]:
        return ["/bin/sh", "-c", NVIDIA_SMI_PROBE]
    return [NodeLayout.of(data).llama_server(build_name(data)), "--version"]


def model_include(data) -> list[str]:
    """The one file of the model repo the recipe fetches."""
    return [data["model_file"]]


# --- drift --------------------------------------------------------------------------------------


def build_items(data, builds: Builds) -> list[di.Item]:
    """The llama.cpp build `current` points at vs the pinned commit and the CMake flags of data."""
    want_name, commit = build_name(data), data["llamacpp_commit"]
    flags = cmake_flags(data)
    current = builds.current_name
    rec = builds.records.get(current) if current else None
    items = [
        di.item(
            "llama.cpp current build",
            current == want_name,
            want_name,
            current or "no `current` link",
        )
    ]
    if rec is None:
        why = "no build.json for current" if current else "no build"
        items += [
            di.item("llama.cpp commit", False, commit, why),
            di.item("llama.cpp CMake flags", False, di.flags_text(flags), why),
        ]
        return items
    items.append(
        di.item(
            "llama.cpp commit",
            rec.get("commit") == commit,
            commit,
            rec.get("commit") or "(not recorded)",
        )
    )
    found_flags = rec.get("cmake_flags") or {}
    exp, got = di.flags_delta(flags, found_flags)
    items.append(di.item("llama.cpp CMake flags", found_flags == flags, exp, got))
    return items
