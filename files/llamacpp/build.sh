#!/bin/sh
# Build llama-server from a pinned llama.cpp commit into a versioned prefix (servefleet).
#
# Uploaded and run by servefleet.engines.llamacpp.operations.build only when the prefix is missing;
# every input comes from the environment:
#   GIT_URL COMMIT TAG   where the source comes from; COMMIT is the pin, TAG a label
#   SRC_DIR BUILD_DIR    the node's clone and scratch build tree (wiped before configuring)
#   PREFIX               the build's own prefix; installed as PREFIX.partial, then renamed
#   CMAKE_ARGS           -DKEY=VALUE ... (no spaces inside one value)
#   LAUNCHER_ARGS        compiler launcher flags (ccache), not part of the build's identity
#   FLAGS_JSON HASH      the flags and their hash, recorded in PREFIX/build.json
#   JOBS                 parallel compile jobs; empty: the CPU count, at most one per 2 GiB of
#                        available RAM (CUDA compiles take 1-2 GiB each)
#   CCACHE_DIR           exported as is when set
# Exit codes: 3 commit not found, 4 HEAD is not the commit, 5 build or install failed.
set -eu

fail() { code=$1; shift; echo "servefleet: llama.cpp build: $*" >&2; exit "$code"; }
log() { echo "servefleet: llama.cpp build: $*"; }

start=$(date +%s)
if [ -z "${JOBS:-}" ]; then
    JOBS=$(nproc)
    by_ram=$(awk '/^MemAvailable:/ { print int($2 / 2097152) }' /proc/meminfo)
    [ "$by_ram" -ge 1 ] || by_ram=1
    [ "$by_ram" -ge "$JOBS" ] || JOBS=$by_ram
fi
mkdir -p "$(dirname "$SRC_DIR")"
if [ ! -d "$SRC_DIR/.git" ]; then
    rm -rf "$SRC_DIR"
    log "cloning $GIT_URL"
    git clone -q --no-checkout "$GIT_URL" "$SRC_DIR" || fail 3 "cannot clone $GIT_URL"
fi
cd "$SRC_DIR"
git remote set-url origin "$GIT_URL"
has_commit() { git cat-file -e "$COMMIT^{commit}" 2>/dev/null; }
if ! has_commit; then
    log "fetching $GIT_URL"
    git fetch -q --tags origin '+refs/heads/*:refs/remotes/origin/*' || true
fi
if ! has_commit; then
    git fetch -q origin "$COMMIT" 2>/dev/null || true  # servers that allow fetching by sha
fi
has_commit || fail 3 "commit $COMMIT ($TAG) not found in $GIT_URL; check llamacpp_commit and llamacpp_git_url"
git -c advice.detachedHead=false checkout -q --force --detach "$COMMIT"
git clean -q -ffdx
head=$(git rev-parse HEAD)
[ "$head" = "$COMMIT" ] || fail 4 "HEAD is $head after checking out $COMMIT"
describe=$(git describe --tags --always 2>/dev/null || echo "$head")
log "source $describe at $head"

[ -n "${CCACHE_DIR:-}" ] && export CCACHE_DIR && mkdir -p "$CCACHE_DIR"
# ccache keys each object on the compiler's message language too (LANG, LC_ALL, LC_CTYPE,
# LC_MESSAGES): one locale for every build, however it was started (sudo over SSH sets none, a
# login or a container C.UTF-8), so what one compiled is a hit for the others.
unset LANG LC_ALL LC_CTYPE LC_MESSAGES
# Hits across build directories and clones: paths under the source dir become relative.
export CCACHE_BASEDIR="$(dirname "$SRC_DIR")" CCACHE_NOHASHDIR=1
rm -rf "$BUILD_DIR"
# shellcheck disable=SC2086  # CMAKE_ARGS and LAUNCHER_ARGS are word lists on purpose
nice cmake -S "$SRC_DIR" -B "$BUILD_DIR" $CMAKE_ARGS $LAUNCHER_ARGS >"$BUILD_DIR.log" 2>&1 \
    || { tail -n 40 "$BUILD_DIR.log" >&2; fail 5 "cmake configure failed (log: $BUILD_DIR.log)"; }
nice cmake --build "$BUILD_DIR" -j "$JOBS" --target llama-server >>"$BUILD_DIR.log" 2>&1 \
    || { tail -n 40 "$BUILD_DIR.log" >&2; fail 5 "cmake build failed (log: $BUILD_DIR.log)"; }

rm -rf "$PREFIX.partial"
mkdir -p "$PREFIX.partial/bin"
cp "$BUILD_DIR/bin/llama-server" "$PREFIX.partial/bin/llama-server"
version=$("$PREFIX.partial/bin/llama-server" --version 2>&1 | tr -s '\n' ' ' | sed 's/ *$//') \
    || fail 5 "the new llama-server does not run: $version"
end=$(date +%s)
TAG="$TAG" HEAD_SHA="$head" DESCRIBE="$describe" VERSION="$version" SECONDS_="$((end - start))" \
python3 -c '
import json, os, sys, time
rec = {"tag": os.environ["TAG"], "commit": os.environ["HEAD_SHA"],
       "describe": os.environ["DESCRIBE"], "hash": os.environ["HASH"],
       "cmake_flags": json.loads(os.environ["FLAGS_JSON"]),
       "version": os.environ["VERSION"], "build_seconds": int(os.environ["SECONDS_"]),
       "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
json.dump(rec, sys.stdout, sort_keys=True)
print()' >"$PREFIX.partial/build.json"
chmod -R a+rX "$PREFIX.partial"
rm -rf "$PREFIX"
mv "$PREFIX.partial" "$PREFIX"
rm -rf "$BUILD_DIR"
log "installed $PREFIX: $version ($((end - start)) s)"
