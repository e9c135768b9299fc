#!/usr/bin/env python3
"""The GPU path of both recipes on the lent H200, through servefleet's own code, with the units
as servefleet renders them for a GPU node (require_gpu = True) and run under their sandbox by
tests/device/sandbox_exec.py (that machine has no systemd). Not part of CI. Driven by
tests/device/gpu_sandbox.sh (read its header for the order of the calls); state in /root/sfgpu,
the node tree in /opt/servefleet as servefleet lays it out; results into $OUT.

    check             the kernel pieces the emulation uses, the device table, nvidia-modprobe
    llama-build       files/llamacpp/build.sh with the environment servefleet.engines.llamacpp.logic.
                      build_env renders from group_data/rtx4090.py (CMAKE_CUDA_ARCHITECTURES=90),
                      the testbed's b9785 source as a git bundle; in the background
    llama-serve       the GGUF lint's flag, the unit rendered, the `--gpu` preflight as root,
                      then the unit (its ExecStartPre preflight and llama-server) in the sandbox,
                      /health and one chat
    vllm-layout       the vLLM payload (vllm_cuda_probe.sh install) as the recipe's venv path and
                      the tiny checkpoint in the models root, owned as on a node
    vllm-serve MDWE   the unit rendered, run in the sandbox (MDWE on|off), /health and one chat
Rendering runs servefleet's modules with the payload's pyinfra closure (/root/sfsite).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("SF_GPU_STATE", "/root/sfgpu"))
OUT = Path(os.environ.get("OUT", STATE / "out"))
SFSITE = Path(os.environ.get("SF_PROBE_SFSITE", "/root/sfsite"))
SITE = Path(os.environ.get("SF_PROBE_SITE", "/root/site"))
TINY = Path(os.environ.get("SF_PROBE_TINY", "/root/tiny"))
CARRIED = REPO / ".devrun" / "sandbox"
USER = "servefleet"
LLAMA_COMMIT = "8724b88a3cdc84e82e64d21fb95287ae91e0c512"  # b9785, the testbed mirror's tag
GGUF = "tiny-qwen35moe-field-missing-mtp.gguf"
SHA = "0" * 40  # the models' revision directories (no hub here)
sys.path[:0] = [str(SFSITE), str(REPO)]


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    with open(OUT / "gpu-sandbox.txt", "a") as fh:
        fh.write(line + "\n")


def sh(cmd, check=True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, text=True, capture_output=True, **kw)
    log(f"$ {' '.join(map(str, cmd))[:300]} -> rc {res.returncode}")
    for line in (res.stdout + res.stderr).splitlines()[-20:]:
        log("    " + line)
    if check and res.returncode != 0:
        raise SystemExit(f"failed: {cmd[:3]}")
    return res


def data(role: str, **overrides) -> dict:
    """group_data all + the role's class and engine, as a GPU node of that role gets it, with
    overrides."""
    from servefleet.core.groupdata import load_group
    from servefleet.fleet.registry import parse_role

    os.chdir(REPO)
    engine = parse_role(role)[1]
    d = {**load_group("all"), **load_group(role), **(load_group(engine.name) if engine else {})}
    d.update(require_gpu=True, **overrides)
    return d


def llama_data() -> dict:
    base = data("rtx4090")
    flags = {**base["llamacpp_cmake_flags"], "CMAKE_CUDA_ARCHITECTURES": "90"}
    return data(
        "rtx4090",
        llamacpp_tag="b9785",
        llamacpp_commit=LLAMA_COMMIT,
        llamacpp_cmake_flags=flags,
        llamacpp_ccache=False,
        model_repo="servefleet-tests/tiny-qwen35moe-missing-mtp-GGUF",
        model_file=GGUF,
        served_model_name="tiny-qwen35moe",
        service_port=8080,
    )


def service_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        sh(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER])
        return pwd.getpwnam(USER)


def node_tree(lay) -> None:
    """The tree as deploys/base.py lays it: root's, only cache/ and the models the service's."""
    user = service_user()
    for d in (lay.root, lay.bin_dir, lay.venvs_dir, lay.llama_dir):
        os.makedirs(d, mode=0o755, exist_ok=True)
    for d in lay.writable_dirs:
        os.makedirs(d, exist_ok=True)
        os.chown(d, user.pw_uid, user.pw_gid)
        os.chmod(d, 0o750)
    for d in (lay.etc_dir, lay.state_dir):
        os.makedirs(d, mode=0o755, exist_ok=True)
    # The hub token as recipes/models.py uploads it (0400, the fetching service user's): a canary.
    with open(lay.hf_token_file, "w") as f:
        f.write("canary-hf-token\n")
    os.chown(lay.hf_token_file, user.pw_uid, 0)
    os.chmod(lay.hf_token_file, 0o400)


def secrets_hidden(unit: Path, lay) -> dict:
    """The engine's sandbox cannot read the hub token nor root's records; its user outside can."""
    seen = {}
    for path in (lay.hf_token_file, lay.state_dir):
        res = subprocess.run(
            [
                sys.executable,
                str(REPO / "tests/device/sandbox_exec.py"),
                str(unit),
                "--argv",
                "/bin/ls",
                "-la",
                path,
            ],
            capture_output=True,
            text=True,
        )
        seen[path] = {
            "rc": res.returncode,
            "said": [
                ln
                for ln in (res.stdout + res.stderr).splitlines()
                if not ln.startswith("sandbox_exec:")
            ][:4],
        }
    outside = subprocess.run(
        ["runuser", "-u", USER, "--", "cat", lay.hf_token_file], capture_output=True, text=True
    )
    seen["outside"] = {"rc": outside.returncode, "read": outside.stdout.strip()}
    log(f"secrets from inside the vLLM sandbox: {json.dumps(seen)}")
    return seen


def render(template: str, context: dict, name: str) -> Path:
    from servefleet.core.systemd import render_unit

    os.chdir(REPO)
    unit = render_unit(template, context)
    path = STATE / name
    path.write_text(unit)
    shutil.copy(path, OUT / name)
    log(f"rendered {name}: {len(unit.splitlines())} lines")
    return path


def wait_health(url: str, proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def chat(port: int, model: str) -> dict:
    body = json.dumps(
        {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def serve(unit: Path, port: int, model: str, tag: str, wait_s: float, *extra: str) -> dict:
    """Run the unit in the sandbox, /health, one chat, stop; the result as a dict."""
    logfile = STATE / f"{tag}.log"
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        extra = (*extra, "--no-mount-namespace")
    t0 = time.monotonic()
    with open(logfile, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests/device/sandbox_exec.py"), str(unit), *extra],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    result = {"tag": tag, "args": list(extra)}
    try:
        healthy = wait_health(f"http://127.0.0.1:{port}/health", proc, wait_s)
        result["health_s"] = round(time.monotonic() - t0, 1) if healthy else None
        if healthy:
            reply = chat(port, model)
            result["chat"] = reply
            log(f"{tag}: /health 200 after {result['health_s']} s; chat: {json.dumps(reply)[:300]}")
        else:
            result["exit"] = proc.poll()
            log(f"{tag}: no /health within {wait_s} s (exit {proc.poll()})")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = logfile.read_text(errors="replace")
    result["sandbox_lines"] = [ln for ln in text.splitlines() if ln.startswith("sandbox_exec:")]
    (OUT / f"{tag}.log").write_text(text[-3_000_000:])
    (OUT / f"{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


# --- steps ---------------------------------------------------------------------------------------


def cmd_check() -> int:
    from servefleet_dev.testing.sandbox_model import DeviceTable

    table = DeviceTable.of_this_machine()
    log(f"device groups: {[g for g in table.groups if 'nvidia' in g[1]]}; nodes {table.nodes}")
    sh(["sh", "-c", "cat /proc/devices; ls -l /dev/nvidia* /dev/nvidia-caps"], check=False)
    sh(
        [
            "sh",
            "-c",
            "command -v nvidia-modprobe; ls -l /usr/bin/nvidia-modprobe; uname -r; "
            "python3 -c 'import torch, sys; print(torch.__version__, torch.__file__, sys.prefix)'; "
            "ls /usr/lib/x86_64-linux-gnu/libseccomp* /lib/x86_64-linux-gnu/libseccomp*; "
            "unshare -m true && echo unshare-ok",
        ],
        check=False,
    )
    return 0


def cmd_llama_build() -> int:
    from servefleet.core.layout import NodeLayout
    from servefleet.engines.llamacpp import logic as llamacpp

    d = llama_data()
    lay = NodeLayout.of(d)
    node_tree(lay)
    name = llamacpp.build_name(d)
    env = llamacpp.build_env(
        git_url=str(CARRIED / "llama-b9785.bundle"),
        commit=d["llamacpp_commit"],
        tag=d["llamacpp_tag"],
        flags_hash=llamacpp.flags_hash(d["llamacpp_commit"], d["llamacpp_cmake_flags"]),
        src_dir=lay.llama_src,
        build_dir=lay.llama_build_dir,
        prefix=lay.llama_prefix(name),
        cmake_flags=d["llamacpp_cmake_flags"],
        launcher_args=llamacpp.launcher_args(d),
        jobs=16,
        nvcc=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc",
    )
    # Where this image keeps cuBLAS (pip's nvidia-cublas) and the driver library: the
    # machine's toolkit layout, appended by gpu_sandbox.sh as probe-only CMake hints.
    env["CMAKE_ARGS"] += os.environ.get("PROBE_CMAKE_EXTRA", "")
    (STATE / "llama-build-env.json").write_text(json.dumps(env, indent=2))
    shutil.copy(STATE / "llama-build-env.json", OUT / "llama-build-env.json")
    log(f"build.sh for {name}: CMAKE_ARGS={env['CMAKE_ARGS']}")
    with open(STATE / "llama-build.log", "w") as fh:
        proc = subprocess.Popen(
            ["sh", str(REPO / "files/llamacpp/build.sh")],
            env={**os.environ, **env},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (STATE / "llama-build.pid").write_text(str(proc.pid))
    log(f"build.sh started in the background (pid {proc.pid})")
    return 0


def cmd_llama_serve() -> int:
    from servefleet.core.layout import NodeLayout
    from servefleet.engines.llamacpp import logic as llamacpp

    d = llama_data()
    lay = NodeLayout.of(d)
    user = service_user()
    name = llamacpp.build_name(d)
    log((STATE / "llama-build.log").read_text()[-1500:])
    server = Path(lay.llama_server(name))
    if not server.exists():
        log(f"no {server}: the build has not finished")
        return 2
    model_dir = f"{lay.models_dir}/servefleet-tests--tiny-qwen35moe-missing-mtp-GGUF/{SHA}"
    os.makedirs(model_dir, exist_ok=True)
    shutil.copy(CARRIED / GGUF, model_dir)
    for p in (Path(model_dir).parent, Path(model_dir), Path(model_dir) / GGUF):
        os.chown(p, user.pw_uid, user.pw_gid)
    shutil.copy(REPO / "files/llamacpp/llama-preflight.sh", lay.bin("servefleet-llama-preflight"))
    os.chmod(lay.bin("servefleet-llama-preflight"), 0o755)
    lint = sh(
        [
            sys.executable,
            str(REPO / "servefleet/core/lint/gguf_lint.py"),
            llamacpp.model_path(model_dir, d),
        ],
        env={**os.environ, "PYTHONPATH": f"{SFSITE}"},
    )
    flag = ",".join(json.loads(lint.stdout.strip().splitlines()[-1]).get("override_kv") or [])
    log(f"GGUF lint: --override-kv {flag}")
    unit = render(
        "files/llamacpp/servefleet-llama.service.j2",
        llamacpp.unit_context(d, model_dir, lambda: flag or None),
        "servefleet-llama.service",
    )
    pre = sh(
        [
            lay.bin("servefleet-llama-preflight"),
            "--model",
            llamacpp.model_path(model_dir, d),
            "--context-bytes",
            str(d["llamacpp_context_bytes"]),
            "--ram-reserve",
            str(d["llamacpp_ram_reserve_bytes"]),
            "--gpu",
        ],
        check=False,
    )
    (OUT / "llama-preflight-gpu.txt").write_text(
        f"$ servefleet-llama-preflight ... --gpu (as root)\nrc {pre.returncode}\n"
        + pre.stdout
        + pre.stderr
    )
    result = serve(unit, 8080, d["served_model_name"], "llama-sandbox", 120)
    return 0 if result.get("chat") else 1


def cmd_vllm_layout() -> int:
    from servefleet.core.layout import NodeLayout
    from servefleet.engines.vllm import logic as vllm

    d = data("spark")
    lay = NodeLayout.of(d)
    node_tree(lay)
    user = service_user()
    venv = Path(vllm.venv_path(d))
    if not (venv / "bin" / "python").exists():
        sh([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    payload = venv / "payload"
    if SITE.is_dir() and not payload.exists():
        shutil.move(str(SITE), payload)  # the vLLM closure installed by vllm_cuda_probe.sh
    pure = sh([str(venv / "bin/python"), "-c", "import site; print(site.getsitepackages()[0])"])
    site_dir = Path(pure.stdout.strip())
    image = sh(
        [
            sys.executable,
            "-c",
            "import site, sys; print('\\n'.join(site.getsitepackages()"
            " + [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]))",
        ]
    )
    (site_dir / "servefleet-payload.pth").write_text(f"{payload}\n{image.stdout}")
    (venv / "bin" / "vllm").write_text(
        f"#!{venv}/bin/python\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )  # as pip writes it (spawn re-runs it)
    os.chmod(venv / "bin" / "vllm", 0o755)
    model = Path(f"{lay.models_dir}/servefleet-tests--tiny-qwen35moe/{SHA}")
    if not model.exists():
        shutil.copytree(TINY, model)
    sh(["chown", "-R", f"{user.pw_name}:{user.pw_name}", str(model.parent)])
    sh(["chmod", "-R", "a+rX", str(venv)])
    sh([str(venv / "bin/vllm"), "--version"], check=False)
    return 0


def cmd_vllm_serve(mdwe: str) -> int:
    from servefleet.core.layout import NodeLayout
    from servefleet.engines.vllm import logic as vllm

    d = data(
        "spark",
        max_model_len=4096,
        kv_cache_memory_bytes=2 * 1024**3,
        served_model_name="tiny",
        vllm_extra_args=["--gdn-prefill-backend", "triton"],
    )
    lay = NodeLayout.of(d)
    model = f"{lay.models_dir}/servefleet-tests--tiny-qwen35moe/{SHA}"
    unit = render(
        "files/vllm/servefleet-vllm.service.j2",
        vllm.unit_context(d, model),
        "servefleet-vllm.service",
    )
    node_tree(lay)
    hidden = secrets_hidden(unit, lay)
    result = serve(
        unit,
        d["service_port"],
        "tiny",
        f"vllm-sandbox-mdwe-{mdwe}",
        420,
        "--mdwe",
        mdwe,
        "--setenv",
        "VLLM_USE_FLASHINFER_SAMPLER=0",
    )
    (OUT / "vllm-secrets.json").write_text(json.dumps(hidden, indent=1))
    return 0 if result.get("chat") else 1


OLD_ALLOW = (
    "DeviceAllow=char-nvidia-frontend rw\nDeviceAllow=char-nvidia-uvm rw\n"
    "DeviceAllow=char-nvidia-caps rw\nDeviceAllow=/dev/nvidiactl rw\n"
    "DeviceAllow=/dev/nvidia-uvm rw\nDeviceAllow=/dev/nvidia-uvm-tools rw\n"
)


def cmd_probes() -> int:
    """The recipes' own sandbox probes (servefleet.core.{llamacpp,vllm}.probe_argv, GPU node)
    under each unit's sandbox, then under the allow list shipped before (must fail)."""
    from servefleet.engines.llamacpp import logic as llamacpp
    from servefleet.engines.vllm import logic as vllm

    rc = 0
    for engine, argv in (
        ("llama.cpp", llamacpp.probe_argv(llama_data())),
        ("vllm", vllm.probe_argv(data("spark"))),
    ):
        unit = STATE / (
            "servefleet-llama.service" if engine == "llama.cpp" else "servefleet-vllm.service"
        )
        text = unit.read_text()
        old = STATE / f"{unit.stem}.old-allow-list.service"
        lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("DeviceAllow=")]
        old.write_text(
            "".join(ln + (OLD_ALLOW if ln.startswith("DevicePolicy=") else "") for ln in lines)
        )
        for tag, path, want in (("unit", unit, 0), ("old allow list", old, "not 0")):
            res = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "tests/device/sandbox_exec.py"),
                    str(path),
                    "--argv",
                    *argv,
                ],
                capture_output=True,
                text=True,
            )
            ok = (res.returncode == 0) == (want == 0)
            rc |= 0 if ok else 1
            log(
                f"probe {engine} under the {tag}: rc {res.returncode} ({'as expected' if ok else 'NOT as expected'}): "
                f"{' '.join(argv)}"
            )
            for line in (res.stdout + res.stderr).splitlines():
                if not line.startswith(
                    ("sandbox_exec: /dev holds", "sandbox_exec: ExecStartPre=+")
                ):
                    log("    " + line[:300])
    return rc


def main(argv: list[str]) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    step = argv[0] if argv else "check"
    steps = {
        "check": cmd_check,
        "llama-build": cmd_llama_build,
        "llama-serve": cmd_llama_serve,
        "vllm-layout": cmd_vllm_layout,
        "probes": cmd_probes,
    }
    if step == "vllm-serve":
        return cmd_vllm_serve(argv[1] if len(argv) > 1 else "on")
    return steps[step]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
