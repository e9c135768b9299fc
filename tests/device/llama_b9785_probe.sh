#!/usr/bin/env bash
# servefleet's llama.cpp recipe with CUDA on a real GPU: llama.cpp release b9785 (the tree the
# testbed pins, llamacpp_commit 8724b88a) built for the H200 with the recipe's CMake flags, then
# the tiny field GGUF (block_count 41, nextn 1, tensors for blk.0-39 only) served on the GPU:
# first as is (llama.cpp must refuse it: blk.40.attn_norm.weight is missing), then with the
# GGUF lint's --override-kv. Not part of CI; for the lent H200 (CUDA 13.0, nvcc, cmake; no
# network, no systemd). State under /root (kept while the machine is held):
#
#   bash tests/device/llama_b9785_probe.sh start-build   # carry: [".devrun/llama"]; returns at
#                                                        # once, the build goes on (setsid)
#   bash tests/device/llama_b9785_probe.sh status        # progress, or the finished build
#   bash tests/device/llama_b9785_probe.sh serve         # waits up to LLAMA_BUILD_WAIT s (300)
#                                                        # for the build, then both starts
# Results in $OUT (and /root/llama/results): llama-probe.txt (everything printed, with the build
# log's last lines), llama-noovr.log, llama-server.log, llama-summary.json. The whole build log
# stays in /root/llama-build.log (vllm_cuda_probe.sh collect packs it with the rest).
#
# .devrun/llama/ (git-ignored, made on the dev machine): llama.cpp-b9785.tar.gz (llama_src.
# export_tree(tag "b9785", trim "mirror"), tarred), tiny-qwen35moe-field-missing-mtp.gguf
# (tiny_models.build_tiny_gguf(layout="field_missing_mtp")), SHA256SUMS.
#
# CMake flags: group_data/rtx4090.py's llamacpp_cmake_flags with CMAKE_CUDA_ARCHITECTURES=90
# (tests/device/llama_probe.py cmake-args); target llama-server only, -j16. Serve: the argv of
# servefleet.engines.llamacpp.logic.unit_context for group_data all + rtx4090 + testbed_llamacpp with
# llamacpp_server_args ["-ngl", "99"], rendered with /root/sfsite (pyinfra + gguf wheels from the
# vLLM probe's payload) when it is installed; without it, assembled the same way and the flag
# from the dev machine's lint (the summary says which).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=${OUT:-/root/llama/out} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
W=${LLAMA_WORK:-/root/llama}
SRC=$W/src/llama.cpp
BUILD=$W/build
BLOG=${LLAMA_BUILD_LOG:-/root/llama-build.log}
BRC=${LLAMA_BUILD_RC:-/root/llama-build.rc}
MODEL_DIR=$W/model
GGUF_NAME=tiny-qwen35moe-field-missing-mtp.gguf
BIN=${LLAMA_BIN:-$BUILD/bin/llama-server}
JOBS=${LLAMA_JOBS:-16}
SFSITE=${SF_PROBE_SFSITE:-/root/sfsite}  # pyinfra + gguf, installed by vllm_cuda_probe.sh install
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/llama-probe.txt") 2>&1
T0=$(date +%s)
say() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

start_build() {
    local d=.devrun/llama
    [ -f "$d/llama.cpp-b9785.tar.gz" ] && [ -f "$d/$GGUF_NAME" ] || {
        say "missing $d/llama.cpp-b9785.tar.gz or $d/$GGUF_NAME: carry .devrun/llama"; return 2; }
    (cd "$d" && sha256sum -c SHA256SUMS) || { say "sha256 mismatch in $d"; return 3; }
    if [ -f "$W/build.pid" ] && kill -0 "$(cat "$W/build.pid")" 2>/dev/null; then
        say "a build is already running (pid $(cat "$W/build.pid"))"; return 0; fi
    mkdir -p "$MODEL_DIR"; cp "$d/$GGUF_NAME" "$MODEL_DIR/"
    rm -rf "$W/src" "$BUILD" "$BRC"; mkdir -p "$W/src"
    tar -xzf "$d/llama.cpp-b9785.tar.gz" -C "$W/src" || return 3
    say "source: $(du -sh "$SRC" | cut -f1) in $SRC"
    local args launcher="" extra="" envs=""
    args=$("$PY" tests/device/llama_probe.py cmake-args) || return 2
    if [ "${LLAMA_CPU_REHEARSAL:-0}" = 1 ]; then  # the dev machine's dry run: no CUDA there
        args=${args/-DGGML_CUDA=ON/-DGGML_CUDA=OFF}
    else
        command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
        command -v nvcc >/dev/null || { say "no nvcc"; return 2; }
        nvcc --version | tail -n 2
        nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
    fi
    # The recipe compiles through ccache (llamacpp_ccache) when the node has it.
    # (servefleet.engines.llamacpp.logic.launcher_args: C, CXX and, with CUDA on, CUDA.)
    if command -v ccache >/dev/null; then
        launcher="-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
        [ "${LLAMA_CPU_REHEARSAL:-0}" = 1 ] || launcher="$launcher -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
    fi
    # cuBLAS and the driver library where the toolkit lacks them (an image whose cuBLAS comes
    # from pip's nvidia-cublas, its driver under /usr/local/nvidia): probe-only, not recipe flags.
    local libs=$W/cuda-libs cuda_root
    rm -rf "$libs"; mkdir -p "$libs"
    if [ "${LLAMA_CPU_REHEARSAL:-0}" != 1 ]; then
    cuda_root=/usr/local/cuda; [ -d "$cuda_root" ] || cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    if ! ls "$cuda_root"/include/cublas_v2.h "$cuda_root"/targets/*/include/cublas_v2.h >/dev/null 2>&1; then
        local pip_cuda
        pip_cuda=$("$PY" -c 'import glob, os, sys
for p in sys.path:
    for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "cublas_v2.h")) + glob.glob(os.path.join(p, "nvidia", "cublas", "include", "cublas_v2.h")):
        print(os.path.dirname(os.path.dirname(h))); raise SystemExit' || true)
        [ -n "$pip_cuda" ] || { say "no cublas_v2.h in $cuda_root nor in pip's nvidia packages"; return 2; }
        say "cuBLAS from pip: $pip_cuda"
        for f in "$pip_cuda"/lib/libcublas*.so.*; do ln -sf "$f" "$libs/$(basename "$f" | sed 's/\.so\..*/.so/')"; done
        mkdir -p "$libs/include"; ln -sf "$pip_cuda"/include/cublas*.h "$libs/include/"
        extra="$extra -DCMAKE_CUDA_FLAGS=-I$libs/include -DCMAKE_CXX_FLAGS=-I$libs/include"
        envs="export LD_LIBRARY_PATH=$pip_cuda/lib:\${LD_LIBRARY_PATH:-}"
    fi
    if ! ls "$cuda_root"/lib64/stubs/libcuda.so "$cuda_root"/lib64/libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so >/dev/null 2>&1; then
        local drv
        drv=$(ls /usr/local/nvidia/lib64/libcuda.so* /usr/local/nvidia/lib/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so.* 2>/dev/null | head -n 1 || true)
        [ -n "$drv" ] && ln -sf "$drv" "$libs/libcuda.so" && say "driver library: $drv"
    fi
    [ -n "$(ls -A "$libs")" ] && extra="$extra -DCMAKE_LIBRARY_PATH=$libs"
    fi
    echo "$envs" > "$W/env.sh"
    say "cmake flags (recipe): $args"
    say "compiler launcher (recipe, when ccache is there): ${launcher:-none (no ccache)}"
    say "probe-only additions: ${extra:-none}"
    printf '{"cmake_args": "%s", "launcher": "%s", "probe_only": "%s", "jobs": %s, "started": %s}\n' \
        "$args" "$launcher" "$extra" "$JOBS" "$(date +%s)" > "$W/build-info.json"
    : > "$BLOG"
    # setsid + nohup: the build outlives this call (the machine keeps it while held).
    setsid nohup bash -c "
        . '$W/env.sh'
        export PATH='$PATH'
        start=\$(date +%s)
        cmake -S '$SRC' -B '$BUILD' $args $launcher $extra && \
        cmake --build '$BUILD' -j $JOBS --target llama-server
        rc=\$?
        echo \"build rc \$rc in \$(( \$(date +%s) - start )) s\"
        echo \$rc > '$BRC'
    " >> "$BLOG" 2>&1 < /dev/null &
    echo $! > "$W/build.pid"
    say "build started in the background (pid $!), log $BLOG"
    sleep 20; say "configure so far:"; grep -E "CUDA|Found|Error|error|Configuring done|Generating done" "$BLOG" | tail -n 15
}

status() {
    if [ -f "$BRC" ]; then
        say "build finished: rc $(cat "$BRC"); $(grep -E '^build rc' "$BLOG" | tail -n 1)"
        [ -x "$BIN" ] && { ls -la "$BIN"; "$BIN" --version 2>&1 | tail -n 3; }
        [ "$(cat "$BRC")" = 0 ] || tail -n 40 "$BLOG"
        return 0
    fi
    if [ -f "$W/build.pid" ] && kill -0 "$(cat "$W/build.pid")" 2>/dev/null; then
        local start; start=$(sed -E 's/.*"started": ([0-9]+).*/\1/' "$W/build-info.json")
        say "building for $(( $(date +%s) - start )) s; last progress: $(grep -oE '^\[ *[0-9]+%\]' "$BLOG" | tail -n 1)"
        grep -E "error|Error" "$BLOG" | tail -n 5
        return 0
    fi
    if [ -f "$W/build.pid" ]; then
        say "the build process $(cat "$W/build.pid") ended without a result (killed, or the machine was"
        say "given back in between): run start-build again"; tail -n 20 "$BLOG" 2>/dev/null; return 1
    fi
    say "no build started (start-build first)"; return 1
}

wait_build() {
    local limit=${LLAMA_BUILD_WAIT:-300} t=0
    [ -n "${LLAMA_BIN:-}" ] && return 0
    while [ ! -f "$BRC" ] && [ $t -lt "$limit" ]; do
        [ -f "$W/build.pid" ] && kill -0 "$(cat "$W/build.pid")" 2>/dev/null || break
        sleep 5; t=$((t + 5))
    done
    [ -f "$BRC" ] && [ "$(cat "$BRC")" = 0 ] && [ -x "$BIN" ]
}

serve() {
    wait_build || { status; say "no built llama-server"; tail -n 60 "$BLOG" 2>/dev/null; return 2; }
    [ -f "$W/env.sh" ] && . "$W/env.sh"
    mkdir -p "$W/results"; rm -f "$W/results"/llama-*
    say "build log, last lines:"; tail -n 25 "$BLOG" 2>/dev/null
    local render=$W/render.json
    if [ -d "$SFSITE" ] && PYTHONPATH=$SFSITE "$PY" tests/device/llama_probe.py render "$MODEL_DIR" "$BIN" > "$render"; then
        say "argv rendered by servefleet's code (pyinfra + gguf from $SFSITE)"
    else
        "$PY" tests/device/llama_probe.py render "$MODEL_DIR" "$BIN" --no-project > "$render" || return 2
        say "argv assembled without pyinfra (no $SFSITE): see rendered_by"
    fi
    LLAMA_RENDER=$render LLAMA_W=$W "$PY" - <<'EOF'
import json, os, re, shlex, signal, subprocess, time, urllib.request, urllib.error
import shutil
W = os.environ["LLAMA_W"]; OUT = os.environ["OUT"]; RES = f"{W}/results"
r = json.load(open(os.environ["LLAMA_RENDER"]))
env = {**os.environ, **r["unit_env"]}
os.makedirs(env["HOME"], exist_ok=True)
summary = {"render": r, "runs": {}}

def log(m): print(f"[llama] {m}", flush=True)

def start(argv, logfile):
    log("$ " + " ".join(f"{k}={v}" for k, v in r["unit_env"].items()) + " " + " ".join(shlex.quote(a) for a in argv))
    with open(logfile, "wb") as h:
        p = subprocess.Popen(argv, stdout=h, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, cwd=env["HOME"], start_new_session=True)
    open(f"{W}/server.pgid", "w").write(str(p.pid))
    return p

def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL); p.wait()
    os.unlink(f"{W}/server.pgid")

def health(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=3) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None

def gpu():
    def q(*a):
        try:
            return subprocess.run(["nvidia-smi", *a], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            return f"nvidia-smi: {exc}"
    return {"gpu_memory_used_total": q("--query-gpu=memory.used,memory.total", "--format=csv,noheader"),
            "compute_apps": q("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")}

# A server an interrupted earlier call left (its recorded process group only).
if os.path.exists(f"{W}/server.pgid"):
    try: os.killpg(int(open(f"{W}/server.pgid").read()), signal.SIGKILL)
    except (ProcessLookupError, ValueError): pass
    os.unlink(f"{W}/server.pgid")

# 1. As is: llama.cpp must refuse the file (the missing MTP block's tensors).
logf = f"{RES}/llama-noovr.log"
p = start(r["argv"]["without_override"], logf)
t0 = time.monotonic(); status = None
while time.monotonic() - t0 < 90 and p.poll() is None:
    status = health(r["url"])
    if status == 200: break
    time.sleep(1)
text = open(logf, errors="replace").read()
lines = [l for l in text.splitlines() if "blk.40.attn_norm.weight" in l or "failed to load model" in l
         or "error loading model" in l]
healthy = status == 200
if p.poll() is None: stop(p)
summary["runs"]["without_override"] = {
    "argv": r["argv"]["without_override"], "exit_code": p.returncode, "healthy": healthy,
    "seconds": round(time.monotonic() - t0, 1), "error_lines": lines[:10],
    "refused_as_expected": (not healthy) and any("blk.40.attn_norm.weight" in l for l in lines)}
log(f"without --override-kv: exit {p.returncode}, healthy {healthy}; " + " | ".join(lines[:4]))

# 2. With the lint's --override-kv, every layer on the GPU.
logf = f"{RES}/llama-server.log"
p = start(r["argv"]["with_override"], logf)
t0 = time.monotonic(); status = None
while time.monotonic() - t0 < 120 and p.poll() is None:
    status = health(r["url"])
    if status == 200: break
    time.sleep(1)
run = {"argv": r["argv"]["with_override"], "health_status": status,
       "seconds_to_health": round(time.monotonic() - t0, 1)}
if status == 200:
    run.update(gpu())
    log(f"/health 200 after {run['seconds_to_health']} s; GPU {run['gpu_memory_used_total']}; apps {run['compute_apps']}")
    log("$ " + " ".join(shlex.quote(a) for a in r["health_argv"]))
    res = subprocess.run(r["health_argv"], capture_output=True, text=True, timeout=300)
    report = None
    for line in reversed(res.stdout.strip().splitlines()):
        try: report = json.loads(line); break
        except ValueError: pass
    run["health_py"] = {"rc": res.returncode, "report": report, "stderr": res.stderr[-1500:]}
    log(f"health.py rc {res.returncode}: {res.stdout.strip()[-800:]}")
else:
    log(f"no /health 200 (last {status}, exit {p.poll()})")
if p.poll() is None: stop(p)
run["exit_code"] = p.returncode
text = open(logf, errors="replace").read()
pat = re.compile(r"ggml_cuda_init|CUDA0|device_info|  - |GPU|offload|using device|VRAM|model buffer|KV buffer|compute buffer|override|block_count|nextn|error", re.I)
run["log_lines"] = [l[:300] for l in text.splitlines() if pat.search(l)][:60]
m = re.search(r"offloaded (\d+)/(\d+) layers to GPU", text)
run["offloaded"] = m.group(0) if m else None
run["cuda_seen"] = bool(re.search(r"CUDA0|ggml_cuda_init", text))
summary["runs"]["with_override"] = run
summary["ok"] = bool(summary["runs"]["without_override"]["refused_as_expected"] and status == 200
                     and run.get("health_py", {}).get("rc") == 0
                     and (run["cuda_seen"] or os.environ.get("LLAMA_CPU_REHEARSAL") == "1"))
json.dump(summary, open(f"{RES}/llama-summary.json", "w"), indent=2)
for name in ("llama-noovr.log", "llama-server.log", "llama-summary.json"):
    shutil.copy2(f"{RES}/{name}", f"{OUT}/{name}")
for l in run["log_lines"][:40]: print("LOG| " + l)
log(f"ok={summary['ok']} (summary: {RES}/llama-summary.json, copied to $OUT)")
raise SystemExit(0 if summary["ok"] else 1)
EOF
}

rc=0
[ $# -gt 0 ] || set -- status
for step in "$@"; do
    say "=== llama_b9785_probe: $step"
    case $step in
        start-build) start_build || rc=$? ;;
        status) status || rc=$? ;;
        serve) serve || rc=$? ;;
        *) say "unknown step $step (start-build | status | serve)"; rc=2 ;;
    esac
    [ $rc -eq 0 ] || break
done
say "=== done, rc $rc"
exit $rc
