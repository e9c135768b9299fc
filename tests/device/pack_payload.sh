#!/usr/bin/env bash
# Rebuild the git-ignored .devrun/ that the H200 probes carry, from scratch (dev machine: the
# project venv, network to PyPI). The device has no network and takes at most 64 MiB per call,
# so everything it needs travels in .devrun/ folders of < 64 MiB each:
#
#   .devrun/cNN/payload.tar.partNN + payload.manifest   tests/device/vllm_cuda_probe.sh stage
#   .devrun/payload.sha256                              (its header has the layout)
#   .devrun/llama/{llama.cpp-b9785.tar.gz, tiny-qwen35moe-field-missing-mtp.gguf, SHA256SUMS}
#                                                       tests/device/llama_b9785_probe.sh
#
# payload.tar: payload/vllm/ = vllm 0.24.0 + the 88 wheels of carried-wheels.txt, payload/sf/ =
# the closure of pyinfra + gguf at this venv's versions, less numpy (the image's), less the 7 in
# payload/vllm/ at the same version (sf/SHARED names those),
# payload/SHA256SUMS; cp312 manylinux x86_64 wheels, cached in $WHEELS (reused; only missing pins
# are downloaded). tests/device/pack_payload.py does the Python parts (pins, closure, llama tree
# via servefleet_dev.testing.llama_src, GGUF via tiny_models).
#
#   bash tests/device/pack_payload.sh        # env: CARRIED (carried-wheels.txt), WHEELS, PYTHON
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C
umask 022
T0=$(date +%s)
PY=${PYTHON:-.venv/bin/python}
HELPER=tests/device/pack_payload.py
WHEELS=${WHEELS:-$HOME/.cache/servefleet/device-wheels}
EARLIER_SHA=83de910fdc55c9502b72d3abc231d8975c2666594f8ca54e65c6bedb55994b38  # earlier build
CARRIED=${CARRIED:-}
for c in shared/gpu-probe/scripts/carried-wheels.txt ../shared/gpu-probe/scripts/carried-wheels.txt; do
    [ -n "$CARRIED" ] || { [ -f "$c" ] && CARRIED=$c; } || true
done
[ -f "$CARRIED" ] || { echo "no carried-wheels.txt (set CARRIED)"; exit 2; }
say() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

# pip download for the device's python: the flags of the vllm_cuda_probe.sh header. PyPI only
# (no local config: indexes, find-links or constraints of this machine must not pick the files).
download() {  # DIR PIN...
    local dir=$1; shift
    local missing=()
    for pin in "$@"; do
        "$PY" "$HELPER" pick "$dir" "$pin" >/dev/null 2>&1 || missing+=("$pin")
    done
    [ ${#missing[@]} -gt 0 ] || { say "$dir: all $# wheels cached"; return 0; }
    say "$dir: downloading ${#missing[@]} of $# wheels"
    PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_CONSTRAINT= "$PY" -m pip download -q \
        --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux_2_31_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
        --index-url https://pypi.org/simple -d "$dir" "${missing[@]}"
}

mapfile -t VLLM_PINS < <("$PY" "$HELPER" vllm-pins "$CARRIED")
mapfile -t SF_LINES < <("$PY" "$HELPER" sf-pins "$CARRIED")
SF_PINS=(); SHARED_PINS=()
for line in "${SF_LINES[@]}"; do
    case $line in *" shared") SHARED_PINS+=("${line% shared}") ;; *) SF_PINS+=("$line") ;; esac
done
say "vllm set: ${#VLLM_PINS[@]} pins; sf set: ${#SF_PINS[@]} own + ${#SHARED_PINS[@]} shared"
mkdir -p "$WHEELS/vllm" "$WHEELS/sf"
download "$WHEELS/vllm" "${VLLM_PINS[@]}"
download "$WHEELS/sf" "${SF_PINS[@]}"
mapfile -t VLLM_FILES < <("$PY" "$HELPER" pick "$WHEELS/vllm" "${VLLM_PINS[@]}")
mapfile -t SF_FILES < <("$PY" "$HELPER" pick "$WHEELS/sf" "${SF_PINS[@]}")
mapfile -t SHARED_FILES < <("$PY" "$HELPER" pick "$WHEELS/vllm" "${SHARED_PINS[@]}")
[ ${#VLLM_FILES[@]} = ${#VLLM_PINS[@]} ] && [ ${#SF_FILES[@]} = ${#SF_PINS[@]} ] \
    && [ ${#SHARED_FILES[@]} = ${#SHARED_PINS[@]} ] || { say "wheels missing after download"; exit 1; }
bad=$(for f in "${VLLM_FILES[@]}" "${SF_FILES[@]}"; do
    case $(basename "$f") in *-none-any.whl|*cp312*manylinux*x86_64*.whl|*abi3*manylinux*x86_64*.whl) ;; *) echo "$f" ;; esac
done)
[ -z "$bad" ] || { say "not a cp312 manylinux x86_64 / any wheel: $bad"; exit 1; }
vllm_whl=$(printf '%s\n' "${VLLM_FILES[@]}" | grep '/vllm-0\.24\.0-')
[ "$(sha256sum "$vllm_whl" | cut -d' ' -f1)" = 2d2831aeba311292250df0132dbc4d8e9f42c654536eaec48e6fe58acb1822cf ] \
    || { say "$vllm_whl: not the recorded sha256 2d2831ae…"; exit 1; }

# The tar (reproducible: fixed order, mtime, owner, modes), split into 58 MiB parts.
BUILD=$(mktemp -d "${TMPDIR:-/tmp}/pack-payload.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT
mkdir -p "$BUILD/payload/vllm" "$BUILD/payload/sf"
cp "${VLLM_FILES[@]}" "$BUILD/payload/vllm/"
cp "${SF_FILES[@]}" "$BUILD/payload/sf/"
for f in "${SHARED_FILES[@]}"; do basename "$f"; done | sort > "$BUILD/payload/sf/SHARED"
(cd "$BUILD/payload" && sha256sum vllm/*.whl sf/*.whl > SHA256SUMS)
chmod 755 "$BUILD/payload" "$BUILD/payload"/*/
chmod 644 "$BUILD/payload"/SHA256SUMS "$BUILD/payload"/*/*
tar --sort=name --mtime=@0 --owner=0 --group=0 -C "$BUILD" -cf "$BUILD/payload.tar" payload
TAR_SHA=$(sha256sum "$BUILD/payload.tar" | cut -d' ' -f1)
TAR_SIZE=$(stat -c %s "$BUILD/payload.tar")
say "payload.tar: $TAR_SIZE B, sha256 $TAR_SHA ($(ls "$BUILD/payload/vllm" | wc -l) vllm + $(ls "$BUILD/payload/sf"/*.whl | wc -l) sf wheels)"
(cd "$BUILD" && split -b 58MiB -d -a 2 payload.tar payload.tar.part)
parts=("$BUILD"/payload.tar.part*)
{ echo "$TAR_SHA  payload.tar"; echo "parts ${#parts[@]}"
  (cd "$BUILD" && sha256sum payload.tar.part*); } > "$BUILD/payload.manifest"

# .devrun/ from scratch: the payload chunks, then the llama bundle.
rm -rf .devrun
mkdir -p .devrun
for p in "${parts[@]}"; do
    n=${p##*.part}
    mkdir ".devrun/c$n"
    mv "$p" ".devrun/c$n/"
    cp "$BUILD/payload.manifest" ".devrun/c$n/"
done
echo "$TAR_SHA  payload.tar" > .devrun/payload.sha256
"$PY" "$HELPER" llama .devrun/llama
(cd .devrun/llama && sha256sum llama.cpp-b9785.tar.gz tiny-qwen35moe-field-missing-mtp.gguf > SHA256SUMS)

# Checks: each folder is one transfer (< 64 MiB); the parts match their manifest and the tar.
limit=$((64 * 1024 * 1024)); fail=0
for d in .devrun/c* .devrun/llama; do
    size=$(du -sb "$d" | cut -f1)
    say "$d: $size B"
    [ "$size" -lt "$limit" ] || { say "$d is not under 64 MiB"; fail=1; }
done
for d in .devrun/c*; do
    (cd "$d" && grep ' payload.tar.part' payload.manifest | grep " $(ls payload.tar.part*)\$" | sha256sum -c --quiet) \
        || { say "$d: part sha256 mismatch"; fail=1; }
done
[ "$(cat .devrun/c*/payload.tar.part* | sha256sum | cut -d' ' -f1)" = "$TAR_SHA" ] \
    || { say "the parts do not join to the tar"; fail=1; }
(cd .devrun/llama && sha256sum -c --quiet SHA256SUMS) || fail=1
if [ "$TAR_SHA" = "$EARLIER_SHA" ]; then say "payload sha256 = the earlier build's"
else say "payload sha256 differs from the earlier build's ${EARLIER_SHA:0:12}… (382,392,320 B)"; fi
say "done, fail=$fail"
exit $fail
