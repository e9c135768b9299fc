"""The llama.cpp recipe's pure logic, facts' parsers, unit template and node-side scripts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.core.errors import DataError
from servefleet.core.lint import gguf_lint
from servefleet.core.systemd import render_unit
from servefleet.engines.llamacpp import logic as llamacpp, logic as ops
from servefleet.engines.llamacpp.facts import GgufLint, LlamaBuilds
from servefleet.fleet.data import HostData, Layer, validate
from servefleet_dev.testbed.material import load as group_data

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "files" / "llamacpp"
LINT_SCRIPT = Path(gguf_lint.__file__)
MODEL_DIR = "/opt/servefleet/models/gaoqianshen--Qwen-AgentWorld-35B-A3B-Q4_K_M-GGUF/" + "a" * 40


def check(data: dict, groups=("rtx4090",)) -> dict:
    return validate(
        HostData("rtx4090-1", list(groups), [Layer("group_data", data)]), "serve_q4_llamacpp"
    )


PROD = ("all", "rtx4090", "llamacpp")
TESTBED = ("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed")


# --- data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [PROD, TESTBED])
def test_shipped_data_is_valid(groups):
    data = group_data(*groups)
    valid = check(data, groups[1:])  # DataError (one line) on a bad default
    # What the recipe runs from: the data as shipped, nothing dropped or rewritten.
    assert valid == data
    assert llamacpp.build_name(valid).startswith(f"{data['llamacpp_tag']}-")


def test_production_pins_and_flags():
    data = group_data(*PROD)
    assert data["llamacpp_commit"] == "8be759e6f70d629638a7eb70db3824cbdcea370b"
    flags = llamacpp.cmake_flags(data)  # the node class's architecture added: Ada's
    assert flags["GGML_CUDA"] == "ON" and flags["CMAKE_CUDA_ARCHITECTURES"] == "89"
    assert flags["GGML_NATIVE"] == "OFF" and flags["LLAMA_USE_PREBUILT_UI"] == "OFF"
    assert flags["BUILD_SHARED_LIBS"] == "OFF"
    assert data["llamacpp_context"] == 65536
    assert llamacpp.build_name(data).startswith("b9784-")
    assert llamacpp.launcher_args(data) == [
        "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
        "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
        "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache",
    ]


def test_testbed_builds_for_cpu_only():
    data = group_data(*TESTBED)
    assert not llamacpp.cuda_on(data["llamacpp_cmake_flags"])
    assert "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache" not in llamacpp.launcher_args(data)


@pytest.mark.parametrize(
    "key,value",
    [
        ("llamacpp_commit", "b9784"),
        ("llamacpp_commit", "8BE759E6F70D629638A7EB70DB3824CBDCEA370B"),
        ("llamacpp_cmake_flags", {"GGML_CUDA": "ON OFF"}),
        ("llamacpp_cmake_flags", {"-DX": "1"}),
        ("llamacpp_git_url", "github.com/ggml-org/llama.cpp"),
        ("model_file", "../x.gguf"),
        ("model_file", "model.bin"),
        ("llamacpp_server_args", ["-ngl 99"]),
        ("llamacpp_min_nvcc_version", 13.0),
    ],
)
def test_bad_recipe_values_are_data_errors(key, value):
    data = group_data(*PROD) | {key: value}
    with pytest.raises(DataError, match=repr(key)):
        check(data)


# --- build identity ------------------------------------------------------------------------------


def test_build_name_changes_with_tag_commit_and_flags_only():
    data = group_data(*PROD)
    name = llamacpp.build_name(data)
    assert name == llamacpp.build_name(dict(data))  # deterministic
    # Flag order is irrelevant; values, commit and tag are not.
    reordered = dict(reversed(list(data["llamacpp_cmake_flags"].items())))
    assert llamacpp.build_name(data | {"llamacpp_cmake_flags": reordered}) == name
    flags = data["llamacpp_cmake_flags"] | {"LLAMA_TOOLS_INSTALL": "OFF"}
    assert llamacpp.build_name(data | {"llamacpp_cmake_flags": flags}) != name
    assert llamacpp.build_name(data | {"llamacpp_commit": "0" * 40}) != name
    assert llamacpp.build_name(data | {"llamacpp_tag": "b9785"}).startswith("b9785-")
    # Not part of the identity: ccache, jobs.
    assert llamacpp.build_name(data | {"llamacpp_ccache": False, "llamacpp_build_jobs": 1}) == name


def test_parse_builds_and_presence():
    rec = {
        "tag": "b1",
        "commit": "a" * 40,
        "cmake_flags": {"X": "ON"},
        "built_at": "2026-01-01T00:00:00Z",
        "version": "version: 1 (abc)",
    }
    lines = [
        f"build b1-111 {json.dumps(rec)}",
        "build b1-bad {not json",
        "current /opt/sf/llama.cpp/b1-111",
    ]
    builds = ops.parse_builds(lines)
    assert list(builds.records) == ["b1-111"] and builds.current_name == "b1-111"
    assert ops.build_present(builds, "b1-111", "a" * 40, {"X": "ON"})
    assert not ops.build_present(builds, "b1-111", "a" * 40, {"X": "OFF"})
    assert not ops.build_present(builds, "b1-222", "a" * 40, {"X": "ON"})
    assert ops.parse_builds(["current "]).current is None


def _builds(names_dates, current):
    return ops.Builds(
        records={n: {"built_at": d} for n, d in names_dates},
        current=f"/opt/sf/llama.cpp/{current}" if current else None,
    )


def test_nvcc_parse_and_build_problems():
    out = [
        "/usr/local/cuda/bin/nvcc",
        "nvcc: NVIDIA (R) Cuda compiler driver",
        "Cuda compilation tools, release 13.0, V13.0.48",
    ]
    nvcc = ops.parse_nvcc(out)
    assert nvcc == {"path": "/usr/local/cuda/bin/nvcc", "version": "13.0"}
    assert ops.parse_nvcc([]) is None
    ok = dict(free_disk=20 * 1024**3, min_free_disk=10 * 1024**3, root="/opt/sf")
    assert ops.build_problems(cuda=True, nvcc=nvcc, min_nvcc="13.0", **ok) == []
    assert ops.build_problems(cuda=True, nvcc=nvcc | {"version": "12.4"}, min_nvcc="12.10", **ok)
    old = ops.build_problems(cuda=True, nvcc=nvcc | {"version": "12.8"}, min_nvcc="13.0", **ok)
    assert "nvcc 12.8" in old[0] and "13.0" in old[0]
    none = ops.build_problems(cuda=True, nvcc=None, min_nvcc="13.0", **ok)
    assert "no nvcc" in none[0] and "GGML_CUDA=OFF" in none[0]
    assert ops.build_problems(cuda=False, nvcc=None, min_nvcc="13.0", **ok) == []
    disk = ops.build_problems(
        cuda=False,
        nvcc=None,
        min_nvcc="0",
        free_disk=1024**3,
        min_free_disk=10 * 1024**3,
        root="/opt/sf",
    )
    assert "1.0 GiB free under /opt/sf" in disk[0]


# --- the GGUF lint fact, on real files ----------------------------------------------------------

USER = "root"  # the lint runs as the service user on nodes (runuser); as root here


def _run_fact(fact, **kwargs):
    cmd = fact.command(**kwargs)
    out = subprocess.run(["sh", "-c", str(cmd)], capture_output=True, text=True)
    return fact.process([ln for ln in out.stdout.splitlines()])


@pytest.mark.parametrize(
    "layout,flag",
    [
        ("missing_mtp", "qwen35moe.block_count=int:4,qwen35moe.nextn_predict_layers=int:0"),
        ("clean", None),
        ("mtp", None),
    ],
)
def test_lint_fact_gives_one_comma_separated_flag(tmp_path, layout, flag):
    from servefleet_dev.testing.tiny_models import build_tiny_gguf

    path = build_tiny_gguf(tmp_path / "m.gguf", layout=layout)
    lint = _run_fact(
        GgufLint(), python=sys.executable, script=str(LINT_SCRIPT), path=str(path), user=USER
    )
    assert lint == ops.Lint("ok", flag)


def test_lint_fact_before_download_and_on_a_broken_file(tmp_path):
    kw = dict(python=sys.executable, script=str(LINT_SCRIPT), user=USER)
    assert _run_fact(GgufLint(), path=str(tmp_path / "none.gguf"), **kw).state == "absent"
    assert (
        _run_fact(
            GgufLint(),
            path=__file__,
            python="/nonexistent/python",
            script=str(LINT_SCRIPT),
            user=USER,
        ).state
        == "nolint"
    )
    # A tools venv without gguf yet (the first converge reads the lint before installing it).
    bare = tmp_path / "venv"
    (bare / "bin").mkdir(parents=True)
    (bare / "lib/python3.11/site-packages").mkdir(parents=True)
    (bare / "bin/python").symlink_to(sys.executable)
    lint = _run_fact(GgufLint(), path=__file__, **{**kw, "python": str(bare / "bin/python")})
    assert lint.state == "nolint"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    lint = _run_fact(GgufLint(), path=str(bad), **kw)
    assert lint.state == "error" and "gguf_lint" in lint.detail


def test_real_defect_gives_the_field_flag(tmp_path):
    # The field file's layout: block_count 41, nextn 1, tensors for blk.0-39 (the lint's own unit
    # tests cover the reader; here: the exact value the 4090 unit gets, through the fact).
    from servefleet_dev.testing.tiny_models import GGUF_FIELD_MISSING_MTP, build_tiny_gguf

    path = build_tiny_gguf(tmp_path / "field.gguf", layout=GGUF_FIELD_MISSING_MTP)
    lint = _run_fact(
        GgufLint(), python=sys.executable, script=str(LINT_SCRIPT), path=str(path), user=USER
    )
    assert lint == ops.Lint(
        "ok", "qwen35moe.block_count=int:40,qwen35moe.nextn_predict_layers=int:0"
    )


# --- the unit ------------------------------------------------------------------------------------


def _render(data, kv):
    cwd = os.getcwd()
    os.chdir(ROOT)  # templates and their includes resolve against the project
    try:
        return render_unit(
            "files/llamacpp/servefleet-llama.service.j2",
            llamacpp.unit_context(data, MODEL_DIR, override_kv=lambda: kv),
        )
    finally:
        os.chdir(cwd)


def _exec_start(unit):
    """ExecStart= with its continuation lines, as one argv."""
    lines = unit.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("ExecStart="))
    words = []
    for line in lines[i:]:
        words += line.rstrip("\\").split()
        if not line.endswith("\\"):
            break
    return words


def test_unit_with_the_lint_flag_and_a_key():
    data = group_data(*PROD) | {"api_key_file": "/home/op/key"}
    flag = "qwen35moe.block_count=int:40,qwen35moe.nextn_predict_layers=int:0"
    unit = _render(data, flag)
    argv = _exec_start(unit)
    assert (
        argv[0]
        == f"ExecStart=/opt/servefleet/llama.cpp/{llamacpp.build_name(data)}/bin/llama-server"
    )
    assert argv[argv.index("-m") + 1] == f"{MODEL_DIR}/qwen-agentworld-35b-a3b-q4_k_m.gguf"
    assert argv[argv.index("-c") + 1] == "65536"
    assert argv.count("--override-kv") == 1 and argv[argv.index("--override-kv") + 1] == flag
    assert argv[argv.index("--api-key-file") + 1] == "%d/api-key"  # systemd's credential
    assert "LoadCredential=api-key:/opt/servefleet/etc/api-key" in unit.splitlines()
    assert (
        argv[argv.index("--port") + 1] == "8080" and argv[argv.index("--host") + 1] == "127.0.0.1"
    )
    assert argv[-2:] == ["--n-gpu-layers", "all"]
    for line in (
        "User=servefleet",
        'Environment="GGML_CUDA_NO_PINNED=1"',
        'Environment="HF_HUB_OFFLINE=1"',
        "Restart=on-failure",
        "MemoryDenyWriteExecute=yes",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia rw",
    ):
        assert line in unit.splitlines()
    pre = unit.split("ExecStartPre=", 1)[1].split("\nExecStart=", 1)[0]
    assert pre.rstrip().endswith("--gpu") and f"--context-bytes {int(1.75 * 1024**3)}" in pre


def test_unit_for_a_correct_gguf_without_key_or_gpu():
    data = group_data(*TESTBED)
    unit = _render(data, None)
    argv = _exec_start(unit)
    assert "--override-kv" not in argv and "--api-key-file" not in argv
    assert "--override-kv" not in unit and "DeviceAllow" not in unit
    pre = unit.split("ExecStartPre=", 1)[1].split("\nExecStart=", 1)[0]
    assert "--gpu" not in pre


# --- ExecStartPre preflight ----------------------------------------------------------------------

GiB = 1024**3


def _preflight(tmp_path, *, avail, vram_mib=None, gpu=False, ctx=GiB, reserve=GiB, size=4096):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * size)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 99999999 kB\nMemAvailable: {avail // 1024} kB\n")
    env = {**os.environ, "SERVEFLEET_MEMINFO": str(meminfo)}
    if vram_mib is not None:
        smi = tmp_path / "smi"
        smi.write_text(f"#!/bin/sh\necho {vram_mib}\n")
        smi.chmod(0o755)
        env["SERVEFLEET_NVIDIA_SMI"] = str(smi)
    else:
        env["SERVEFLEET_NVIDIA_SMI"] = str(tmp_path / "no-nvidia-smi")
    args = [
        str(FILES / "llama-preflight.sh"),
        "--model",
        str(model),
        "--context-bytes",
        str(ctx),
        "--ram-reserve",
        str(reserve),
    ] + (["--gpu"] if gpu else [])
    return subprocess.run(args, capture_output=True, text=True, env=env)


def test_preflight_ram_only_without_gpu(tmp_path):
    ok = _preflight(tmp_path, avail=3 * GiB)
    assert ok.returncode == 0, ok.stderr
    short = _preflight(tmp_path, avail=int(1.5 * GiB))
    assert short.returncode == 1
    assert (
        "refusing to start llama-server: available RAM 1.50 GiB < 2.00 GiB needed" in short.stderr
    )


def test_preflight_field_numbers_on_a_24_gib_card(tmp_path):
    # The Q4_K_M file (19.71 GiB) + 1.75 GiB at -c 65536 fits an idle 4090 (~23.5 GiB free) ...
    size, ctx = 21_166_758_816, int(1.75 * GiB)
    model = tmp_path / "big.gguf"
    with open(model, "wb") as fh:  # sparse: the size is what counts
        fh.truncate(size)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {28 * 1024 * 1024} kB\n")
    smi = tmp_path / "smi"

    def run(free_mib):
        smi.write_text(f"#!/bin/sh\necho {free_mib}\n")
        smi.chmod(0o755)
        return subprocess.run(
            [
                str(FILES / "llama-preflight.sh"),
                "--model",
                str(model),
                "--context-bytes",
                str(ctx),
                "--ram-reserve",
                str(2 * GiB),
                "--gpu",
            ],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "SERVEFLEET_MEMINFO": str(meminfo),
                "SERVEFLEET_NVIDIA_SMI": str(smi),
            },
        )

    assert run(24_000).returncode == 0
    # ... but not a card where something else holds 3 GiB.
    busy = run(24_000 - 3 * 1024)
    assert busy.returncode == 1 and "free VRAM 20.44 GiB < 21.46 GiB needed" in busy.stderr


def test_preflight_gpu_needs_nvidia_smi(tmp_path):
    res = _preflight(tmp_path, avail=64 * GiB, gpu=True)
    assert res.returncode == 1 and "nvidia-smi" in res.stderr


def test_preflight_gpu_refuses_no_devices_found(tmp_path):
    """nvidia-smi prints "No devices were found" (exit 0) when /dev/nvidia0 is out of the unit's
    reach: seen on the H200 under the old allow list (fixtures/h200/sandbox/)."""
    res = _preflight(tmp_path, avail=64 * GiB, gpu=True, vram_mib="No devices were found")
    assert res.returncode == 1
    assert res.stderr.strip() == (
        "servefleet preflight: refusing to start llama-server: "
        "nvidia-smi reports no usable GPU: No devices were found"
    )


def test_preflight_missing_model(tmp_path):
    res = subprocess.run(
        [
            str(FILES / "llama-preflight.sh"),
            "--model",
            str(tmp_path / "x"),
            "--context-bytes",
            "0",
            "--ram-reserve",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "is missing" in res.stderr


# --- build.sh with a fake cmake ------------------------------------------------------------------

FAKE_CMAKE = """#!/bin/sh
# configure: -S SRC -B BUILD ...; build: --build BUILD ...
if [ "$1" = "-S" ]; then mkdir -p "$4/bin"; echo "$@" > "$4/configured"; exit 0; fi
if [ "$1" = "--build" ]; then
  printf '#!/bin/sh\\necho "version: 1 (fake)" >&2\\n' > "$2/bin/llama-server"; chmod +x "$2/bin/llama-server"
  exit 0
fi
exit 1
"""


@pytest.fixture
def src_repo(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "CMakeLists.txt").write_text("project(x)\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "one"], ["tag", "b1"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (bindir / "cmake").write_text(FAKE_CMAKE)
    (bindir / "cmake").chmod(0o755)
    return repo, sha, bindir


def _build_sh(tmp_path, repo, sha, bindir, prefix_name="b1-x"):
    d = tmp_path / "node" / "llama.cpp"
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        **llamacpp.build_env(  # as the recipe's build step gives it; JOBS empty: build.sh picks
            git_url=str(repo),
            commit=sha,
            tag="b1",
            flags_hash="x",
            src_dir=str(d / "src"),
            build_dir=str(d / "build"),
            prefix=str(d / prefix_name),
            cmake_flags={"GGML_CUDA": "OFF", "X": "1"},
        ),
    }
    return d, subprocess.run(
        ["sh", str(FILES / "build.sh")], capture_output=True, text=True, env=env
    )


def test_build_script_installs_a_prefix_with_its_record(tmp_path, src_repo):
    repo, sha, bindir = src_repo
    d, res = _build_sh(tmp_path, repo, sha, bindir)
    assert res.returncode == 0, res.stderr
    rec = json.loads((d / "b1-x" / "build.json").read_text())
    assert (
        rec["commit"] == sha and rec["describe"] == "b1" and rec["version"] == "version: 1 (fake)"
    )
    assert rec["cmake_flags"] == {"GGML_CUDA": "OFF", "X": "1"}
    assert os.access(d / "b1-x" / "bin" / "llama-server", os.X_OK)
    assert not (d / "build").exists() and not (d / "b1-x.partial").exists()
    # The fact reads what the script wrote.
    builds = _run_fact(LlamaBuilds(), llama_dir=str(tmp_path / "node" / "llama.cpp"))
    assert builds.records["b1-x"]["commit"] == sha and builds.current is None


def test_build_script_stops_when_the_commit_is_not_there(tmp_path, src_repo):
    repo, _, bindir = src_repo
    d, res = _build_sh(tmp_path, repo, "0123456789abcdef0123456789abcdef01234567", bindir)
    assert res.returncode == 3
    assert "commit 0123456789abcdef0123456789abcdef01234567 (b1) not found in" in res.stderr
    assert not (d / "b1-x").exists()
