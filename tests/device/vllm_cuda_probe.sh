#!/usr/bin/env bash
# servefleet's vLLM recipe on a real GPU: the real vLLM 0.24.0 wheel serving the tiny Qwen3.5-MoE
# checkpoint with the `vllm serve` argv servefleet renders, its KV-cache lines against plan-kv,
# files/health/health.py and files/bench/stream_bench.py. Not part of CI; for the lent H200
# (x86_64, driver 580, CUDA 13.0, python3 3.12 with torch 2.11.0+cu130, transformers; no network,
# no systemd). Steps (tests/device/vllm_probe.py does the work; state under /root/sfprobe):
#
#   bash tests/device/vllm_cuda_probe.sh stage              # carry: [".devrun/cNN"], one chunk
#   bash tests/device/vllm_cuda_probe.sh install            # waits for the background install
#   bash tests/device/vllm_cuda_probe.sh help               # vllm serve --help=all -> $OUT
#   bash tests/device/vllm_cuda_probe.sh serve 4096 2147483648
#   bash tests/device/vllm_cuda_probe.sh serve 3000 1073741824
#   bash tests/device/vllm_cuda_probe.sh collect            # every result as one tar.gz
#   bash tests/device/vllm_cuda_probe.sh status
# Several steps in one call: `... install help serve 4096 2147483648` (serve takes its two
# numbers). Everything printed also lands in $OUT/vllm-probe.txt.
#
# The payload (made on the dev machine in the git-ignored .devrun/): one tar, payload/vllm/ =
# the vllm 0.24.0 wheel + the 88 dependency wheels of shared/gpu-probe/scripts/carried-wheels.txt,
# payload/sf/ = pyinfra 3.10.0's closure + gguf 0.19.0 (the project venv's versions; SHARED names
# the 7 it takes from payload/vllm/), payload/SHA256SUMS; all cp312 manylinux x86_64 wheels from
# `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_{28,27,24,17,5,31}_x86_64 --platform manylinux{2014,1}_x86_64
# --platform any`; tar --sort=name --mtime=@0 --owner=0 --group=0, `split -b 58MiB -d -a 2`,
# each part in .devrun/cNN/ with payload.manifest (tar sha256, part count, parts' sha256). One
# chunk per call (64 MiB per call). `stage` checks each part against the manifest and, once all
# are there, starts `install` in the background (setsid), which survives the call.
#
# Probe-only additions, not recipe arguments (the payload has no FlashInfer; see
# shared/gpu-probe/README.md): env VLLM_USE_FLASHINFER_SAMPLER=0 and --gdn-prefill-backend triton.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
export SF_PROBE_STATE=${SF_PROBE_STATE:-/root/sfprobe} SF_PROBE_SFSITE=${SF_PROBE_SFSITE:-/root/sfsite}
export OUT=${OUT:-$SF_PROBE_STATE/out}
mkdir -p "$OUT" "$SF_PROBE_STATE"
exec > >(tee -a "$OUT/vllm-probe.txt") 2>&1
T0=$(date +%s)
PROBE=tests/device/vllm_probe.py
[ $# -gt 0 ] || set -- status
rc=0
while [ $# -gt 0 ]; do
    step=$1; shift
    echo "=== [t+$(( $(date +%s) - T0 ))s] vllm_cuda_probe: $step"
    case $step in
        stage|install|help|collect|status)
            "$PYTHON" "$PROBE" "$step" || { rc=$?; echo "step $step: rc $rc"; break; } ;;
        serve|render)
            [ $# -ge 2 ] || { echo "usage: $step MAX_MODEL_LEN KV_CACHE_MEMORY_BYTES"; rc=2; break; }
            len=$1 pool=$2; shift 2
            if [ "$step" = render ]; then
                PYTHONPATH=$SF_PROBE_SFSITE:$PWD "$PYTHON" "$PROBE" render "$len" "$pool" || rc=$?
            else
                "$PYTHON" "$PROBE" serve "$len" "$pool" ${SERVE_OPTS:-} || rc=$?
            fi
            [ $rc -eq 0 ] || { echo "step $step $len $pool: rc $rc"; break; } ;;
        *) echo "unknown step $step"; rc=2; break ;;
    esac
done
echo "=== [t+$(( $(date +%s) - T0 ))s] vllm_cuda_probe: done, rc $rc"
exit $rc
