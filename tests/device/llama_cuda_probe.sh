#!/usr/bin/env bash
# The llama.cpp recipe's build step with CUDA on a real GPU host (the lent x86_64 H200, CUDA 13),
# then the tiny missing-MTP GGUF served on the GPU. Not part of CI; the lead runs it.
#
# Prepare on the dev machine (both land in the git-ignored .devrun/, < 60 MiB together):
#   python -m servefleet_dev.testing.llama_src --export .devrun/llama-src --trim device    # ~38 MiB
#   python -c "from servefleet_dev.testing.tiny_models import build_tiny_gguf as b; \
#              b('.devrun/tiny-missing-mtp.gguf', layout='missing_mtp')"             # ~8 MiB
# plus pyinfra importable there (carry its wheels if the image lacks it). Then, on the device:
#   bash tests/device/llama_cuda_probe.sh          (run tool: carry [".devrun"], timeout_s 600)
# PROBE_FAST=1 adds GGML_CUDA_FA=OFF (no FlashAttention kernels: a much shorter CUDA compile).
#
# Steps: (1) commit the trimmed tree into a local bare repo with servefleet's deterministic helper,
# (2) `pyinfra @local servefleet.llamacpp.build` with GGML_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=90
# (the recipe's own step: nvcc preflight, build.sh, prefix, `current`), (3) llama-server on the
# GPU with the --override-kv the GGUF lint derives, /health, one chat completion, and the log
# lines that show CUDA offload. Everything it prints also lands in $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SRC=${LLAMA_SRC:-.devrun/llama-src}
GGUF=${TINY_GGUF:-.devrun/tiny-missing-mtp.gguf}
OUT=${OUT:-/tmp/llama-probe-out}
WORK=${WORK:-/tmp/sf-llama-probe}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/probe.log") 2>&1

echo "== tools"
missing=()
for t in git cmake nvcc g++ curl nvidia-smi; do
    command -v "$t" >/dev/null || [ -x "/usr/local/cuda/bin/$t" ] || missing+=("$t")
done
"$PY" -c 'import pyinfra' 2>/dev/null || missing+=("python:pyinfra")
[ -d "$SRC" ] || missing+=("$SRC (see the header)")
[ -f "$GGUF" ] || missing+=("$GGUF (see the header)")
if [ ${#missing[@]} -gt 0 ]; then echo "probe: missing: ${missing[*]}"; exit 2; fi
export PATH="$PATH:/usr/local/cuda/bin"
nvcc --version | tail -n 2
nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version,compute_cap --format=csv
uname -m; nproc

echo "== (1) source repo"
rm -rf "$WORK/llama.cpp.git"
commit=$("$PY" -m servefleet_dev.testing.llama_src --commit-dir "$SRC" --mirror "$WORK/llama.cpp.git")
echo "commit $commit"

echo "== (2) build step: pyinfra @local servefleet.llamacpp.build"
flags='{"GGML_CUDA": "ON", "CMAKE_CUDA_ARCHITECTURES": "90", "GGML_NATIVE": "OFF",
 "LLAMA_USE_PREBUILT_UI": "OFF", "BUILD_SHARED_LIBS": "OFF", "LLAMA_BUILD_TESTS": "OFF",
 "LLAMA_BUILD_EXAMPLES": "OFF", "CMAKE_BUILD_TYPE": "Release"'
[ "${PROBE_FAST:-0}" = 1 ] && flags="$flags, \"GGML_CUDA_FA\": \"OFF\""
# cuBLAS headers/libraries and the driver library where the toolkit lacks them (an image with
# nvcc but cuBLAS only from pip's nvidia-cublas, the driver under /usr/local/nvidia): a lib dir of
# unversioned links, passed as flags (data), exported for the run too.
libs="$WORK/cuda-libs"; rm -rf "$libs"; mkdir -p "$libs"
cuda_root=/usr/local/cuda; [ -d "$cuda_root" ] || cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
if ! ls "$cuda_root"/include/cublas_v2.h "$cuda_root"/targets/*/include/cublas_v2.h >/dev/null 2>&1; then
    pip_cuda=$("$PY" -c 'import glob, os, sys
for p in sys.path:
    for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "cublas_v2.h")) + glob.glob(os.path.join(p, "nvidia", "cublas", "include", "cublas_v2.h")):
        print(os.path.dirname(os.path.dirname(h))); raise SystemExit' || true)
    [ -n "$pip_cuda" ] || { echo "probe: no cublas_v2.h in $cuda_root nor in pip's nvidia packages"; exit 2; }
    echo "cuBLAS from pip: $pip_cuda"
    for f in "$pip_cuda"/lib/libcublas*.so.*; do ln -sf "$f" "$libs/$(basename "$f" | sed 's/\.so\..*/.so/')"; done
    # Only cuBLAS's headers: pip's include dir also holds a CUDA runtime that must not shadow nvcc's.
    mkdir -p "$libs/include"; ln -sf "$pip_cuda"/include/cublas*.h "$libs/include/"
    flags="$flags, \"CMAKE_CUDA_FLAGS\": \"-I$libs/include\", \"CMAKE_CXX_FLAGS\": \"-I$libs/include\""
    export LD_LIBRARY_PATH="$pip_cuda/lib:${LD_LIBRARY_PATH:-}"
fi
if ! ls "$cuda_root"/lib64/stubs/libcuda.so "$cuda_root"/lib64/libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so >/dev/null 2>&1; then
    drv=$(ls /usr/local/nvidia/lib64/libcuda.so* /usr/local/nvidia/lib/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so.* 2>/dev/null | head -n 1 || true)
    [ -n "$drv" ] && ln -sf "$drv" "$libs/libcuda.so" && echo "driver library: $drv"
fi
[ -n "$(ls -A "$libs")" ] && flags="$flags, \"CMAKE_LIBRARY_PATH\": \"$libs\""
flags="$flags}"
ccache=false; command -v ccache >/dev/null && ccache=true
t0=$(date +%s)
"$PY" -m pyinfra -y @local servefleet.llamacpp.build \
    --data servefleet_root="$WORK/root" \
    --data llamacpp_git_url="$WORK/llama.cpp.git" --data llamacpp_commit="$commit" \
    --data llamacpp_tag=probe --data "llamacpp_cmake_flags=$(echo "$flags" | tr -d '\n')" \
    --data llamacpp_ccache=$ccache --data llamacpp_build_jobs="$(nproc)" \
    --data llamacpp_keep_builds=2 --data llamacpp_build_min_free_disk_bytes=$((5 * 1024**3)) \
    --data 'llamacpp_min_nvcc_version="13.0"'  # JSON: a bare 13.0 would be a float
echo "build step: $(( $(date +%s) - t0 )) s"
cur="$WORK/root/llama.cpp/current"
cat "$cur/build.json" | tee "$OUT/build.json"; echo
"$cur/bin/llama-server" --version 2>&1 | tee "$OUT/version.txt"
ldd "$cur/bin/llama-server" | grep -Ei "cuda|cublas|ggml|llama" || true

echo "== (3) serve the tiny GGUF on the GPU"
flag=$("$PY" servefleet/lint/gguf_lint.py --flag "$GGUF" 2>/dev/null) || {
    flag="qwen35moe.block_count=int:4,qwen35moe.nextn_predict_layers=int:0"
    echo "(gguf not importable here: using the flag the lint gives for this file on the dev machine)"; }
echo "--override-kv $flag"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
GGML_CUDA_NO_PINNED=1 HF_HUB_OFFLINE=1 "$cur/bin/llama-server" -m "$GGUF" --alias tiny -c 4096 \
    --host 127.0.0.1 --port "$port" --n-gpu-layers all --override-kv "$flag" \
    >"$OUT/llama-server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
    [ "$code" = 200 ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
echo "/health: $(curl -s "http://127.0.0.1:$port/health") (HTTP $code)"
curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}' \
    | tee "$OUT/completion.json"; echo
echo "== llama-server log: CUDA offload"
grep -Ei "ggml_cuda_init|CUDA0|offload|using device|VRAM|model buffer|KV buffer|compute buffer|error" \
    "$OUT/llama-server.log" || true
nvidia-smi --query-compute-apps=pid,used_memory --format=csv || true
[ "$code" = 200 ] || { echo "probe: llama-server did not become healthy"; tail -n 40 "$OUT/llama-server.log"; exit 1; }
echo "probe: ok"
