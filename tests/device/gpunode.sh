#!/usr/bin/env bash
# A real GPU node on the lent H200: the testbed's guest image booted with real systemd as PID 1
# (systemd-nspawn, the GPU's nodes bound in, the device filter on), then converged by
# deploys/serve_q4_llamacpp.py over SSH from the operator's side, and checked
# (tests/device/gpunode/steps.py). Not part of CI. Made on the dev machine first:
#
#   .venv/bin/python -m servefleet_dev.testbed.gpunode pack     # .devrun/gpunode/cNN/ (<60 MiB)
#
# then one device call per part, in quick succession (the machine keeps /root/gpunode while held):
#
#   carry [".devrun/gpunode/c00"]:  bash tests/device/gpunode.sh stage
#   ...
#   carry [".devrun/gpunode/cNN"]:  bash tests/device/gpunode.sh stage up converge_bg
#   bash tests/device/gpunode.sh wait_converge
#   bash tests/device/gpunode.sh steps again drift rollout rollback broken final collect
#   GATE_TRIALS=8 bash tests/device/gpunode.sh gate_bg   # the performance gate's error rates on
#   bash tests/device/gpunode.sh wait_gate collect      # the GPU (benchmarks/perf_gate.py --node)
#
# Results: $OUT/gpunode-results.tar.gz (each step's JSON and log, the unit, the nspawn line, the
# guest's journal), committed to tests/fixtures/h200/node/ (tests/unit/test_h200_node.py). On
# 2026-12-03 the four staging calls, the converge (the CUDA build: 333 s) and the steps took
# 12.7 min of device time.
#
# GPUNODE_REHEARSAL=1 runs the same on a machine without a GPU (this workplace's), from
# .devrun/gpunode/, the CPU build fed by the testbed's ccache. `down` ends the guest.
#
# Named deviations from a real 4090 node (docs/evidence.md): the toolkit's missing cuBLAS
# libraries and libcuda stub are composed into the guest's /usr/local/cuda from what the H200 has
# (pip's nvidia cu13 libraries, the driver's libcuda); nvidia-smi and the driver libraries are
# bound in at /usr/local/nvidia, reached from /usr/bin and the loader path; no nvidia-modprobe;
# the carried mirror, wheelhouse and hub replace the network.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
W=${GPUNODE_DIR:-/root/gpunode}
REHEARSAL=${GPUNODE_REHEARSAL:-0}
OUT=${OUT:-$W/out}
T=$W/tools          # the launching chroot: the image's tree with the operator's packages
G=$W/guest          # the guest's root
P=$W/payload        # ssh/, simple/, git/, hub/
NAME=gpunode
mkdir -p "$W/parts" "$OUT"
exec > >(tee -a "$W/gpunode.log") 2>&1
T0=$(date +%s)
say() { echo "[gpunode t+$(( $(date +%s) - T0 ))s] $*"; }

in_tools() {  # a command in the launching chroot, the project as working directory
    chroot "$T" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        PYTHONPATH=/opt/sf-operator/site:/repo SERVEFLEET_GPUNODE_DIR=/gpunode \
        SERVEFLEET_GPUNODE_REHEARSAL="$REHEARSAL" SERVEFLEET_CACHE=/gpunode/cache \
        NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        PYTHONUNBUFFERED=1 GATE_TRIALS="${GATE_TRIALS:-5}" sh -c "cd /repo && $*"
}

nspawn_pid() { cat "$W/nspawn.pid" 2>/dev/null; }

# The guest's PID 1: systemd, a direct child of *our* nspawn, PID 1 in its own namespace (never
# a process found by name: another container's systemd would match).
guest_pid1() {
    local np; np=$(nspawn_pid) || return 1
    for s in /proc/[0-9]*/status; do
        grep -q "^PPid:[[:space:]]*$np\$" "$s" 2>/dev/null || continue
        grep -qE '^NSpid:[[:space:]]+[0-9]+[[:space:]]+1$' "$s" 2>/dev/null || continue
        basename "${s%/status}"; return 0
    done
    return 1
}

in_guest() {
    local gp; gp=$(guest_pid1) || { echo "no guest"; return 1; }
    nsenter -t "$gp" -a --root --wd env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

stage() {  # the carried part(s) of this call into $W/parts
    local found=0
    for d in .devrun/gpunode/c[0-9][0-9]; do
        [ -f "$d/part" ] || continue
        cp "$d/payload.json" "$W/payload.json"
        cp "$d/part" "$W/parts/$(basename "$d")"; found=1
        say "staged $(basename "$d") ($(du -h "$d/part" | cut -f1))"
    done
    [ $found = 1 ] || { [ "$REHEARSAL" = 1 ] && return 0; say "no part carried"; return 2; }
}

assemble() {
    local want have
    if [ "$REHEARSAL" = 1 ]; then  # every part is here: no device calls to spread them over
        for d in .devrun/gpunode/c[0-9][0-9]; do cp "$d/part" "$W/parts/$(basename "$d")"; done
        cp .devrun/gpunode/payload.json "$W/payload.json"
    fi
    want=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["parts"]))' "$W/payload.json")
    have=$(ls "$W/parts" | wc -l)
    [ "$have" = "$want" ] || { say "have $have of $want parts: stage the others first"; return 2; }
    cat "$W"/parts/c* > "$W/payload.tar.xz"
    python3 - "$W/payload.json" "$W/payload.tar.xz" <<'EOF' || return 3
import hashlib, json, sys
m = json.load(open(sys.argv[1])); h = hashlib.sha256()
with open(sys.argv[2], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
ok = h.hexdigest() == m["sha256"]
print("payload sha256", "ok" if ok else "MISMATCH"); sys.exit(0 if ok else 1)
EOF
}

compose_cuda() {
    # The guest's /usr/local/cuda: the H200's toolkit, plus what it lacks (cuBLAS's libraries,
    # libcuda's stub), as a read-only overlay. Deviation: on a real node the toolkit has them.
    local root lib rel extra=$W/cuda-extra pip
    root=$(readlink -f /usr/local/cuda); lib=$(readlink -f "$root/lib64")
    rel=${lib#"$root"/}
    rm -rf "$extra"; mkdir -p "$extra/$rel/stubs" "$W/cuda"
    pip=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -n 1)
    for so in libcublas libcublasLt; do
        if ! ls "$lib/$so.so"* >/dev/null 2>&1; then
            [ -n "$pip" ] || { say "no $so in the toolkit nor in pip's nvidia packages"; return 2; }
            cp -a "$pip"/lib/$so.so.* "$extra/$rel/"
            ln -sf "$(basename "$(ls "$pip"/lib/$so.so.* | head -n 1)")" "$extra/$rel/$so.so"
            say "composed: $so from $pip/lib"
        fi
    done
    ls "$root"/include/cublas_v2.h >/dev/null 2>&1 || { mkdir -p "$extra/include";
        cp -a "$pip"/include/cublas* "$extra/include/"; say "composed: cuBLAS headers"; }
    if ! ls "$lib/stubs/libcuda.so" >/dev/null 2>&1; then
        ln -sf /usr/local/nvidia/lib64/libcuda.so.1 "$extra/$rel/stubs/libcuda.so"
        say "composed: stubs/libcuda.so -> the driver's libcuda"
    fi
    if ! mountpoint -q "$W/cuda" && ! mount -t overlay overlay -o "lowerdir=$extra:$root" "$W/cuda"; then
        say "no overlayfs: a copy of the toolkit instead"; cp -a "$root/." "$W/cuda/" && cp -a "$extra/." "$W/cuda/"
    fi
    echo "$rel" > "$W/cuda-rel"
}

up() {
    if guest_pid1 >/dev/null; then say "the guest runs already"; return 0; fi
    assemble || return $?
    rm -rf "$W/unpack" "$T" "$G" "$P"; mkdir -p "$W/unpack"
    if command -v xz >/dev/null; then tar -C "$W/unpack" -xJf "$W/payload.tar.xz" || return 3
    else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], numeric_owner=True, filter="fully_trusted")' \
        "$W/payload.tar.xz" "$W/unpack" || return 3; fi
    mv "$W/unpack/payload" "$P"; mv "$P/rootfs" "$T"
    cp -a "$T" "$G"; rm -rf "$G/opt/sf-operator"
    say "unpacked: $(du -sh "$T" | cut -f1) a tree"
    mkdir -p "$P/cache" "$P/results"
    local binds=(--bind-ro=/gpunode/git:/var/cache/servefleet/git)
    if [ "$REHEARSAL" = 1 ]; then
        local cc=${GPUNODE_CCACHE:-$HOME/.cache/servefleet/testbed/shared/ccache}
        mkdir -p "$P/ccache"; mountpoint -q "$P/ccache" || mount --bind "$cc" "$P/ccache"
        binds+=(--bind=/gpunode/ccache:/var/cache/servefleet/ccache)
    else
        compose_cuda || return $?
        # The driver's tools and libraries where a node has them: /usr/bin and the loader path.
        mkdir -p "$G/usr/local/nvidia" "$G/usr/local/cuda" "$T/usr/local/nvidia" "$T/cuda"
        ln -sf /usr/local/nvidia/bin/nvidia-smi "$G/usr/bin/nvidia-smi"
        echo /usr/local/nvidia/lib64 > "$G/etc/ld.so.conf.d/000-nvidia-driver.conf"
        echo "/usr/local/cuda/$(cat "$W/cuda-rel")" > "$G/etc/ld.so.conf.d/988_cuda.conf"
        for n in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-caps; do
            [ -e "$n" ] && binds+=("--bind=$n"); done
        binds+=(--bind-ro=/usr/local/nvidia --bind-ro=/cuda:/usr/local/cuda)
    fi
    # The launching chroot: Debian's nspawn with its own libraries; / must be a mount point.
    tr -d - < /proc/sys/kernel/random/uuid > "$T/etc/machine-id"
    mkdir -p "$T/guest" "$T/repo" "$T/gpunode"
    mountpoint -q "$T" || mount --bind "$T" "$T"
    mount --rbind /proc "$T/proc"; mount --rbind /sys "$T/sys"; mount --rbind /dev "$T/dev"
    mount -t tmpfs tmpfs "$T/run"; mount -t tmpfs tmpfs "$T/tmp"
    mount --bind "$G" "$T/guest"; mount --bind "$REPO" "$T/repo"; mount --bind "$P" "$T/gpunode"
    [ "$REHEARSAL" = 1 ] || { mount --bind /usr/local/nvidia "$T/usr/local/nvidia"; mount --bind "$W/cuda" "$T/cuda"; }
    cp /etc/resolv.conf "$T/etc/resolv.conf" 2>/dev/null || true
    # SSH_PORT HUB_PORT INDEX_PORT POLICY: servefleet_dev.testbed.gpunode's, as shell words
    eval "$(in_tools python3 -m servefleet_dev.testbed.gpunode settings)"
    [ -n "${POLICY:-}" ] || { say "cannot read the testbed's nspawn flags"; return 3; }
    local policy=$POLICY
    local nsp=(/usr/bin/systemd-nspawn -D /guest -M "$NAME" --boot --register=no --keep-unit
               --console=read-only $policy "${binds[@]}")
    echo "${nsp[*]}" > "$P/results/nspawn-cmdline.txt"
    say "nspawn: ${nsp[*]}"
    mkdir -p "/sys/fs/cgroup/$NAME"
    setsid bash -c "echo \$\$ > /sys/fs/cgroup/$NAME/cgroup.procs; echo \$\$ > $W/nspawn.pid; exec chroot $T ${nsp[*]}" \
        > "$W/nspawn.log" 2>&1 < /dev/null &
    local gp=
    for _ in $(seq 60); do gp=$(guest_pid1) && break; sleep 0.5; done
    [ -n "$gp" ] || { say "no guest PID 1"; cat "$W/nspawn.log"; return 3; }
    say "guest PID 1 is $gp (child of our nspawn $(nspawn_pid))"
    timeout 90 nsenter -t "$gp" -a --root --wd systemctl is-system-running --wait; say "guest: systemd $(in_guest systemctl is-system-running)"
    in_guest systemctl --failed --no-pager --no-legend
    in_guest ldconfig
    # The carried hub and wheelhouse on the machine's loopback (the guest shares its network).
    setsid chroot "$T" env -i PATH=/usr/bin:/bin PYTHONPATH=/opt/sf-operator/site:/repo \
        sh -c "cd /repo && exec python3 -m servefleet_dev.hub serve --root /gpunode/hub \
        --host 127.0.0.1 --port $HUB_PORT" > "$W/hub.log" 2>&1 < /dev/null &
    mkdir -p "$P/index"; ln -sfn ../simple "$P/index/simple"  # pip_index_url's /simple/
    setsid chroot "$T" python3 -m http.server --bind 127.0.0.1 --directory /gpunode/index \
        "$INDEX_PORT" > "$W/index.log" 2>&1 < /dev/null &
    sleep 1
    say "up: guest $(in_guest hostname), $(in_guest systemctl --version | head -n 1)"
    [ "$REHEARSAL" = 1 ] || in_guest nvidia-smi -L
}

steps() { in_tools python3 tests/device/gpunode/steps.py "$@"; }

# Steps that outlast a call (the first converge: the CUDA build, ~6 min on 16 cores; the gate's
# trials) start in the background (their own session survives the call); the next call waits.
in_bg() {  # in_bg STEP: tests/device/gpunode/steps.py STEP, in the background
    rm -f "$P/results/$1.json"
    setsid bash "$REPO/tests/device/gpunode.sh" steps "$1" > "$W/$1-bg.log" 2>&1 < /dev/null &
    say "$1 started in the background (log $W/$1-bg.log)"
}

wait_for() {  # wait_for STEP: until its results JSON is written (GPUNODE_WAIT s at most)
    local limit=${GPUNODE_WAIT:-560} t=0
    while [ ! -f "$P/results/$1.json" ] && [ $t -lt "$limit" ]; do sleep 5; t=$((t + 5)); done
    tail -n 3 "$W/$1-bg.log"
    [ -f "$P/results/$1.json" ] || { say "$1 still running after ${limit}s"; return 4; }
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("checks"), d.get("error")); sys.exit(0 if d.get("ok") else 1)' "$P/results/$1.json"
}

converge_bg() { in_bg converge; }
wait_converge() { wait_for converge; }
gate_bg() { in_bg gate; }
wait_gate() { wait_for gate; }

collect() {
    local r=$P/results
    cp "$W/gpunode.log" "$r/device.log" 2>/dev/null; cp "$W/nspawn.log" "$r/nspawn.log" 2>/dev/null
    in_guest journalctl -b --no-pager -o short-iso-precise > "$r/journal.txt" 2>&1
    in_guest systemctl show servefleet-llama.service > "$r/systemctl-show.txt" 2>&1
    tar -C "$P" -czf "$OUT/gpunode-results.tar.gz" results
    cat "$r"/*.json 2>/dev/null | python3 -c 'import sys; print(sys.stdin.read()[:3000])'
    say "results: $OUT/gpunode-results.tar.gz ($(du -h "$OUT/gpunode-results.tar.gz" | cut -f1))"
}

down() {
    local np; np=$(nspawn_pid)
    in_guest systemctl poweroff 2>/dev/null
    for _ in $(seq 40); do [ -n "$np" ] && [ -d "/proc/$np" ] || break; sleep 0.5; done
    [ -n "$np" ] && [ -d "/proc/$np" ] && kill -KILL "$np"
    pkill -f "servefleet_dev.hub serve --root /gpunode/hub" ; pkill -f "directory /gpunode/index"
    for m in $(awk -v t="$W" '$2 ~ "^"t {print $2}' /proc/self/mounts | sort -r); do umount -l "$m"; done
    rm -f "$W/nspawn.pid"; say "down"
}

rc=0
while [ $# -gt 0 ]; do
    step=$1; shift
    case $step in
        stage|up|collect|down|converge_bg|wait_converge|gate_bg|wait_gate) say "=== $step"; $step || { rc=$?; say "$step failed ($rc)"; break; } ;;
        steps) args=(); while [ $# -gt 0 ] && [[ ! $1 =~ ^(stage|up|collect|down|converge_bg|wait_converge|gate_bg|wait_gate)$ ]]; do args+=("$1"); shift; done
               say "=== steps ${args[*]}"; steps "${args[@]}" || rc=1 ;;
        *) say "unknown step $step"; rc=2; break ;;
    esac
done
say "=== done, rc $rc"
exit $rc
