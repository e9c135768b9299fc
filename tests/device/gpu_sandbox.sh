#!/usr/bin/env bash
# Both recipes' GPU paths on the lent H200 through servefleet's own code, the engines under the
# units' sandbox (tests/device/sandbox_exec.py; the machine has no systemd). Not part of CI.
# The work is tests/device/gpu_sandbox.py's; this script orders it over the device calls
# (files under /root stay while the machine is held; at most 64 MiB travel per call):
#
#   1. carry [".devrun/sandbox", ".devrun/c06"]:  gpu_sandbox.sh start
#        check; pyinfra's closure for rendering; llama.cpp build.sh in the background; stage c06
#   2..7. carry [".devrun/cNN"] (c00..c05):       gpu_sandbox.sh stage   (the last one starts
#        the vLLM payload's install in the background, tests/device/vllm_probe.py)
#   8. gpu_sandbox.sh vllm MDWE                   install done -> layout -> vLLM in the sandbox
#   9. gpu_sandbox.sh llama                       the CUDA build's result, then llama-server in
#        the sandbox (ExecStartPre: the --gpu preflight), /health and one chat; then both
#        recipes' sandbox probes under their units and under the old allow list (must fail)
#
# .devrun/sandbox/ (git-ignored, made on the dev machine): llama-b9785.bundle (`git bundle
# create ... b9785` of the testbed's mirror: the commit the testbed pins, 8724b88a),
# tiny-qwen35moe-field-missing-mtp.gguf, sf/ (pyinfra 3.10 + gguf closure, cp312 wheels).
# Results land in $OUT: gpu-sandbox.txt and each step's logs / JSON.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OUT=${OUT:-/root/sfgpu/out} SF_PROBE_SFSITE=/root/sfsite
mkdir -p "$OUT" /root/sfgpu
PY=python3
command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"

# cuBLAS where this image keeps it (pip's nvidia-cublas beside torch, not the toolkit): the
# build gets include/library hints, the loader a ld.so.conf entry (what a node's CUDA
# toolkit install does). Probe-only: not recipe flags; printed into the results.
cuda_hints() {
    local libs=/root/sfgpu/cuda-libs pip_cuda drv
    rm -rf "$libs"; mkdir -p "$libs/include"
    pip_cuda=$("$PY" -c 'import glob, os, sys
for p in sys.path:
    for h in glob.glob(os.path.join(p, "nvidia", "cu*", "include", "cublas_v2.h")):
        print(os.path.dirname(os.path.dirname(h))); raise SystemExit' 2>/dev/null || true)
    if [ -n "$pip_cuda" ] && ! ls /usr/local/cuda/include/cublas_v2.h >/dev/null 2>&1; then
        for f in "$pip_cuda"/lib/libcublas*.so.*; do
            ln -sf "$f" "$libs/$(basename "$f" | sed 's/\.so\..*/.so/')"; done
        ln -sf "$pip_cuda"/include/cublas*.h "$libs/include/"
        echo "$pip_cuda/lib" > /etc/ld.so.conf.d/servefleet-probe-cublas.conf
        export PROBE_CMAKE_EXTRA=" -DCMAKE_CUDA_FLAGS=-I$libs/include -DCMAKE_CXX_FLAGS=-I$libs/include"
    fi
    if ! ls /usr/local/cuda/lib64/stubs/libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so >/dev/null 2>&1; then
        drv=$(ls /usr/local/nvidia/lib64/libcuda.so.* /usr/lib/x86_64-linux-gnu/libcuda.so.* 2>/dev/null | head -n 1)
        [ -n "$drv" ] && ln -sf "$drv" "$libs/libcuda.so" && \
            echo "$(dirname "$drv")" > /etc/ld.so.conf.d/servefleet-probe-driver.conf
    fi
    PROBE_CMAKE_EXTRA="${PROBE_CMAKE_EXTRA:-} -DCMAKE_LIBRARY_PATH=$libs"
    export PROBE_CMAKE_EXTRA
    ldconfig
    echo "probe-only: cuBLAS ${pip_cuda:-from the toolkit}; CMake hints:$PROBE_CMAKE_EXTRA" | tee -a "$OUT/gpu-sandbox.txt"
}

step=${1:-check}
case $step in
    start)
        "$PY" tests/device/gpu_sandbox.py check
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --disable-pip-version-check --target "$SF_PROBE_SFSITE" .devrun/sandbox/sf/*.whl \
            && echo "pyinfra closure in $SF_PROBE_SFSITE"
        cuda_hints
        "$PY" tests/device/gpu_sandbox.py llama-build
        "$PY" tests/device/vllm_probe.py stage
        sleep 25; tail -n 5 /root/sfgpu/llama-build.log ;;
    stage)
        "$PY" tests/device/vllm_probe.py stage
        tail -n 2 /root/sfgpu/llama-build.log ;;
    vllm)
        "$PY" tests/device/vllm_probe.py install --wait 420 || exit $?
        "$PY" tests/device/gpu_sandbox.py vllm-layout || exit $?
        "$PY" tests/device/gpu_sandbox.py vllm-serve "${2:-on}" ;;
    llama)
        tail -n 3 /root/sfgpu/llama-build.log
        "$PY" tests/device/gpu_sandbox.py llama-serve
        rc=$?
        "$PY" tests/device/gpu_sandbox.py probes || rc=1
        cp /root/sfgpu/*.service "$OUT/"
        exit $rc ;;
    check)
        "$PY" tests/device/gpu_sandbox.py check ;;
    *) echo "unknown step $step"; exit 2 ;;
esac
