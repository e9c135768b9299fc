#!/bin/sh
# ExecStartPre of servefleet-llama.service (servefleet, files/llamacpp/): refuse to start when
# the node lacks the memory to load the model, with the numbers in the journal.
#
#   llama-preflight --model FILE --context-bytes N --ram-reserve N [--gpu]
#
# --gpu:    free VRAM (nvidia-smi, the GPU with the most) >= model file + context bytes, and
#           available RAM >= ram reserve (the weights go to the GPU).
# no --gpu: available RAM (MemAvailable) >= model file + context bytes + ram reserve.
# context bytes: what the KV cache and compute buffers take at the configured -c (data).
# Test hooks: SERVEFLEET_MEMINFO (a meminfo file), SERVEFLEET_NVIDIA_SMI (a command).
set -eu

model= ctx= reserve= gpu=0
while [ $# -gt 0 ]; do
    case "$1" in
        --model) model=$2; shift 2;;
        --context-bytes) ctx=$2; shift 2;;
        --ram-reserve) reserve=$2; shift 2;;
        --gpu) gpu=1; shift;;
        *) echo "llama-preflight: unknown argument $1" >&2; exit 2;;
    esac
done
refuse() { echo "servefleet preflight: refusing to start llama-server: $*" >&2; exit 1; }
gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }

[ -r "$model" ] || refuse "model file $model is missing or unreadable"
size=$(stat -L -c %s "$model")
avail=$(awk '/^MemAvailable:/ { printf "%.0f", $2 * 1024 }' "${SERVEFLEET_MEMINFO:-/proc/meminfo}")

if [ "$gpu" = 1 ]; then
    smi=${SERVEFLEET_NVIDIA_SMI:-nvidia-smi}
    free_mib=$($smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | sort -n | tail -n 1) \
        || refuse "nvidia-smi failed: no usable GPU driver"
    [ -n "$free_mib" ] || refuse "nvidia-smi is missing or lists no GPU"
    # "No devices were found" (exit 0) where the GPU's device node is not reachable, e.g. a
    # DeviceAllow= that misses it.
    case $free_mib in
        *[!0-9]*) refuse "nvidia-smi reports no usable GPU: $free_mib";;
    esac
    free_vram=$((free_mib * 1048576))
    need_vram=$((size + ctx))
    [ "$free_vram" -ge "$need_vram" ] || refuse "free VRAM $(gib "$free_vram") < $(gib "$need_vram") needed" \
        "(model file $(gib "$size") + context $(gib "$ctx")); stop what else uses the GPU or lower -c"
    need_ram=$reserve
    what="RAM reserve $(gib "$reserve")"
else
    need_ram=$((size + ctx + reserve))
    what="model file $(gib "$size") + context $(gib "$ctx") + reserve $(gib "$reserve")"
fi
[ "$avail" -ge "$need_ram" ] || refuse "available RAM $(gib "$avail") < $(gib "$need_ram") needed ($what)"
echo "servefleet preflight: ok (model $(gib "$size"), RAM available $(gib "$avail")$([ "$gpu" = 1 ] && echo ", VRAM free $(gib "$free_vram")"))"
