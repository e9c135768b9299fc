#!/usr/bin/env python3
"""Rendering for tests/device/llama_b9785_probe.sh: servefleet's llama.cpp recipe values.

    llama_probe.py cmake-args                 the recipe's -DKEY=VALUE list (stdlib only)
    llama_probe.py render MODEL_DIR BINARY    JSON: the lint's flag, llama-server argv without
                                              and with --override-kv, health.py's argv

cmake-args: group_data/rtx4090.py's llamacpp_cmake_flags (the RTX 4090 recipe, CUDA on) with
CMAKE_CUDA_ARCHITECTURES=90 for the H200, joined as servefleet.engines.llamacpp.operations.build joins
them (`-D{k}={v}`, sorted).

render: data = group_data all + rtx4090 + testbed_llamacpp (the tiny field GGUF, its name and
alias) with llamacpp_server_args = ["-ngl", "99"] (every layer on the GPU; the testbed's CPU
build has none); the argv is servefleet.engines.llamacpp.logic.unit_context's ExecStart with the node's
binary path replaced by BINARY; the flag is the project's GGUF lint
(servefleet/core/lint/gguf_lint.py, run as on the node); health.py's argv is
servefleet.operations.health.argv with the recipe's gate arguments. Those modules import pyinfra
and gguf: run with /root/sfsite (the vLLM probe's payload carries their wheels) on PYTHONPATH.
Without it (`--no-project`), the argv is assembled here in the same order and the flag is the
one the lint prints on the dev machine for this file; the JSON says which.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GROUPS = ("all", "rtx4090", "llamacpp", "testbed_llamacpp")
CUDA_ARCH = "90"  # the H200 (sm_90); the recipe's 89 is the RTX 4090
SERVER_ARGS = ["-ngl", "99"]
# What `gguf_lint.py --flag` prints for build_tiny_gguf(layout="field_missing_mtp") (dev machine).
KNOWN_FLAG = "qwen35moe.block_count=int:40,qwen35moe.nextn_predict_layers=int:0"


def load_data(groups=GROUPS) -> dict:
    sys.path.insert(0, str(REPO))
    from servefleet.core.groupdata import load_group  # stdlib only

    data: dict = {}
    for group in groups:
        data.update(load_group(group, REPO) or {})
    return data


def cmake_flags() -> dict:
    flags = dict(load_data(("all", "rtx4090", "llamacpp"))["llamacpp_cmake_flags"])
    flags["CMAKE_CUDA_ARCHITECTURES"] = CUDA_ARCH
    return flags


def cmd_cmake_args() -> int:
    flags = cmake_flags()
    print(" ".join(f"-D{k}={v}" for k, v in sorted(flags.items())))
    return 0


def lint_flag(gguf: Path) -> tuple[str | None, str]:
    res = subprocess.run(
        [sys.executable, str(REPO / "servefleet/core/lint/gguf_lint.py"), "--flag", str(gguf)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        return None, f"lint rc {res.returncode}: {res.stderr.strip()[-300:]}"
    return res.stdout.strip() or None, "servefleet/core/lint/gguf_lint.py --flag on this machine"


def exec_argv(exec_start: str) -> list[str]:
    """servefleet.core.systemd.exec_line's text back to words (plain words here)."""
    return shlex.split(exec_start.replace("\\\n", " "))


def cmd_render(model_dir: str, binary: str, project: bool) -> int:
    data = load_data()
    data["llamacpp_server_args"] = list(SERVER_ARGS)
    gguf = Path(model_dir) / data["model_file"]
    out: dict = {
        "groups": list(GROUPS),
        "overrides": {"llamacpp_server_args": SERVER_ARGS},
        "model": str(gguf),
        "served_model_name": data["served_model_name"],
        "port": data["service_port"],
        "cmake_flags": cmake_flags(),
    }
    if project:
        os.chdir(REPO)
        from servefleet.core.layout import NodeLayout, api_url
        from servefleet.engines.llamacpp import logic
        from servefleet.operations import health as health_ops

        flag, how = lint_flag(gguf)
        out["flag"], out["flag_source"] = flag, how
        if flag is None:
            raise SystemExit(f"the lint gave no flag: {how}")
        argvs = {}
        for name, overrides in (("without_override", False), ("with_override", True)):
            ctx = logic.unit_context(
                {**data, "llamacpp_gguf_overrides": overrides}, model_dir, override_kv=lambda: flag
            )
            argv = exec_argv(ctx["exec_start"]())
            out.setdefault("unit_binary", argv[0])
            argvs[name] = [binary, *argv[1:]]
        env = dict(
            e.strip('"').split("=", 1)
            for e in logic.unit_context(data, model_dir, override_kv=lambda: flag)["environment"]
        )
        lay = NodeLayout.of(data)
        health = health_ops.argv(
            str(REPO / "files/health/health.py"),
            data["python_interpreter"]["ubuntu"],
            api_url(data),
            data["served_model_name"],
            logic.UNIT,
            key_file=lay.api_key_file if data.get("api_key_file") else None,
            timeout_s=data["health_timeout_s"],
            settle_s=data["health_settle_s"],
            expect_stopped=data["service_state"] != "running",
        )
        out["rendered_by"] = (
            "servefleet.engines.llamacpp.logic.unit_context + operations.health.argv"
        )
    else:
        flag = KNOWN_FLAG
        out["flag"], out["flag_source"] = flag, "dev machine's lint output (no gguf here)"
        base = [
            binary,
            "-m",
            str(gguf),
            "--alias",
            data["served_model_name"],
            "-c",
            str(data["llamacpp_context"]),
            "--host",
            data["service_host"],
            "--port",
            str(data["service_port"]),
        ]
        argvs = {
            "without_override": base + SERVER_ARGS,
            "with_override": base + ["--override-kv", flag] + SERVER_ARGS,
        }
        env = {"HOME": "/opt/servefleet/cache", "GGML_CUDA_NO_PINNED": "1", "HF_HUB_OFFLINE": "1"}
        url = f"http://{data['service_host']}:{data['service_port']}"
        health = [
            "python3",
            "-I",
            str(REPO / "files/health/health.py"),
            "--url",
            url,
            "--model",
            data["served_model_name"],
            "--unit",
            "servefleet-llama.service",
            "--timeout",
            str(data["health_timeout_s"]),
            "--settle",
            str(data["health_settle_s"]),
        ]
        out["rendered_by"] = "assembled in tests/device/llama_probe.py (no pyinfra/gguf here)"
    out["argv"] = argvs
    out["unit_env"] = env
    health[health.index("--unit") + 1] = ""  # no systemd on the probe machine
    out["health_argv"] = health
    out["url"] = f"http://127.0.0.1:{data['service_port']}"
    print(json.dumps(out))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["cmake-args"]:
        return cmd_cmake_args()
    if argv[:1] == ["render"] and len(argv) in (3, 4):
        return cmd_render(argv[1], argv[2], project="--no-project" not in argv)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
