"""
llama.cpp on a node: facts about its builds, the CUDA compiler and the GGUF it serves, and the
operations of deploys/serve_q4_llamacpp.py (build into a versioned prefix, switch ``current``,
prune, lint check, health check, smoke test).

Layout on the node (``ROOT`` = servefleet_root)::

    ROOT/llama.cpp/src/                 git clone of the source (checked out at the pinned commit)
    ROOT/llama.cpp/build/               scratch build tree, wiped before and after each build
    ROOT/llama.cpp/<tag>-<hash>/        one installed build: bin/llama-server + build.json
    ROOT/llama.cpp/current -> <tag>-<hash>   what the service runs

``build.json`` records tag, commit, ``git describe``, the CMake flags, their hash and
``llama-server --version``; the ``LlamaBuilds`` fact reads it, so an unchanged rerun is a no-op.
Run one on its own::

    pyinfra @local servefleet.operations.llamacpp.switch root=/opt/servefleet build=b9784-0123abcd4567
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from pyinfra import host
from pyinfra.api import FactBase, StringCommand, operation
from pyinfra.operations import files

from servefleet.facts import FreeDiskBytes
from servefleet.operations.node import fail_host
from servefleet.paths import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "files" / "llamacpp" / "build.sh"


def llama_dir(root: str) -> str:
    return f"{root.rstrip('/')}/llama.cpp"


# --- facts -------------------------------------------------------------------------------------

@dataclass
class Builds:
    """Installed builds (prefix name -> build.json record) and the target of ``current``."""

    records: dict[str, dict] = field(default_factory=dict)
    current: str | None = None  # absolute path the link points to; None when there is no link

    @property
    def current_name(self) -> str | None:
        return self.current.rstrip("/").rsplit("/", 1)[-1] if self.current else None


def parse_builds(lines: list[str]) -> Builds:
    builds = Builds()
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "build":
            name, _, text = rest.partition(" ")
            try:
                builds.records[name] = json.loads(text)
            except ValueError:
                continue  # a half-written record is no build
        elif kind == "current" and rest.strip():
            builds.current = rest.strip()
    return builds


class LlamaBuilds(FactBase):
    """The llama.cpp builds installed under ``root`` and where ``current`` points."""

    def command(self, root: str):
        d = shlex.quote(llama_dir(root))
        return (f'for f in {d}/*/build.json; do [ -f "$f" ] && '
                'printf "build %s %s\\n" "$(basename "$(dirname "$f")")" "$(tr -d "\\n" < "$f")"; '
                f'done; printf "current %s\\n" "$(readlink {d}/current 2>/dev/null)"; true')

    def process(self, output):
        return parse_builds(output)


def parse_nvcc(lines: list[str]) -> dict | None:
    """{"path", "version"} from the fact's output: the path, then `nvcc --version`."""
    if not lines or not lines[0].strip():
        return None
    match = re.search(r"release (\d+\.\d+)", "\n".join(lines))
    return {"path": lines[0].strip(), "version": match.group(1) if match else None}


class Nvcc(FactBase):
    """The CUDA compiler: on PATH or in /usr/local/cuda/bin; None when there is none."""

    def command(self):
        return ('for n in nvcc /usr/local/cuda/bin/nvcc; do p=$(command -v "$n") && '
                '{ echo "$p"; "$p" --version; break; }; done; true')

    def process(self, output):
        return parse_nvcc(output)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text)))


@dataclass
class Lint:
    state: str  # ok | absent (no file) | nolint (no gguf in the tools venv yet) | error
    flag: str | None = None  # the --override-kv value when state is ok and there is a defect
    detail: str = ""


def parse_lint(lines: list[str]) -> Lint:
    text = "\n".join(lines).strip()
    state, _, rest = text.partition(" ")
    rest = rest.strip()
    if state == "ok":
        return Lint("ok", rest or None)
    if state in ("absent", "nolint"):
        return Lint(state)
    return Lint("error", None, rest or text)


class GgufLint(FactBase):
    """The GGUF lint (servefleet/lint/gguf_lint.py) of a file on the node, run with ``python``.

    ``Lint.flag`` is the one comma-separated ``--override-kv`` value, None for a correct file.
    """

    def command(self, python: str, script: str, path: str):
        py, sc, p = (shlex.quote(x) for x in (python, script, path))
        return (f"if [ ! -f {p} ]; then echo absent; "
                f"elif [ ! -x {py} ] || [ ! -f {sc} ] || ! {py} -c 'import gguf' 2>/dev/null; "
                "then echo nolint; "
                f"elif out=$({py} {sc} --flag {p} 2>&1); then echo \"ok $out\"; "
                "else echo \"error $out\"; fi")

    def process(self, output):
        return parse_lint(output)


# --- pure decisions ----------------------------------------------------------------------------

def build_present(builds: Builds, name: str, commit: str, cmake_flags: dict) -> bool:
    rec = builds.records.get(name)
    return bool(rec) and rec.get("commit") == commit and rec.get("cmake_flags") == cmake_flags


def builds_to_prune(builds: Builds, keep: int, keep_names: tuple[str, ...] = ()) -> list[str]:
    """Oldest builds beyond `keep` (newest first by built_at); current and keep_names stay."""
    protected = {n for n in (builds.current_name, *keep_names) if n}
    ordered = sorted(builds.records, key=lambda n: builds.records[n].get("built_at", ""),
                     reverse=True)
    kept = [n for n in ordered if n in protected]
    for name in ordered:
        if len(kept) >= keep:
            break
        if name not in kept:
            kept.append(name)
    return [n for n in ordered if n not in kept]


def build_problems(*, cuda: bool, nvcc: dict | None, min_nvcc: str, free_disk: int,
                   min_free_disk: int, root: str) -> list[str]:
    """What stops a build on this node; [] when it can build."""
    problems = []
    if cuda:
        if not nvcc:
            problems.append("GGML_CUDA=ON but no nvcc (not on PATH nor in /usr/local/cuda/bin): "
                            "install the CUDA toolkit (an operator prerequisite), or set "
                            "GGML_CUDA=OFF in llamacpp_cmake_flags")
        elif not nvcc.get("version") or version_tuple(nvcc["version"]) < version_tuple(min_nvcc):
            problems.append(f"nvcc {nvcc.get('version') or '(unknown version)'} at {nvcc['path']} "
                            f"is older than llamacpp_min_nvcc_version {min_nvcc}")
    if free_disk < min_free_disk:
        problems.append(f"{free_disk / 1024**3:.1f} GiB free under {root}, a llama.cpp build "
                        f"needs {min_free_disk / 1024**3:.1f} GiB (llamacpp_build_min_free_disk_bytes)")
    return problems


# --- operations --------------------------------------------------------------------------------

@operation()
def build(root: str, build: str, git_url: str, commit: str, tag: str, cmake_flags: dict,
          flags_hash: str, launcher_args: list[str] = (), jobs: int | None = None,
          ccache_dir: str | None = None, min_free_disk: int = 0, min_nvcc: str | None = None):
    """
    Build llama-server at a pinned commit into ``ROOT/llama.cpp/BUILD``, unless that build exists.

    + root: servefleet_root
    + build: the prefix name, ``<tag>-<flags_hash>``
    + git_url: clone/fetch URL (a mirror or a local path works)
    + commit: the 40-hex commit that is built; HEAD is verified against it
    + tag: a label recorded with the build (``git describe`` is recorded too)
    + cmake_flags: {VAR: VALUE} passed as -DVAR=VALUE; part of the build's identity
    + flags_hash: hash of commit + flags, recorded in build.json
    + launcher_args: compiler launcher flags (ccache); not part of the identity
    + jobs: parallel compile jobs (None: the CPU count, at most one per 2 GiB of available RAM)
    + ccache_dir: CCACHE_DIR for the build (None: ccache's default)
    + min_free_disk: bytes that must be free under root before building
    + min_nvcc: oldest nvcc accepted when GGML_CUDA is on (None: no check)

    Refusals (no nvcc, old nvcc, no disk) and build errors fail this host only. The running
    service is untouched: it runs ``current``, which ``switch`` moves after a build.

    **Example:**

    .. code:: python

        llamacpp.build(root="/opt/servefleet", build="b9784-0123abcd4567",
                       git_url="https://github.com/ggml-org/llama.cpp.git",
                       commit="8be759e6f70d629638a7eb70db3824cbdcea370b", tag="b9784",
                       cmake_flags={"GGML_CUDA": "ON"}, flags_hash="0123abcd4567")
    """
    builds = host.get_fact(LlamaBuilds, root=root)
    if build_present(builds, build, commit, cmake_flags):
        host.noop(f"llama.cpp {build} is installed: {builds.records[build].get('version')}")
        return
    cuda = str(cmake_flags.get("GGML_CUDA", "OFF")).upper() in ("ON", "1", "TRUE", "YES")
    nvcc = host.get_fact(Nvcc) if cuda else None
    problems = build_problems(
        cuda=cuda and bool(min_nvcc), nvcc=nvcc, min_nvcc=min_nvcc or "0",
        free_disk=host.get_fact(FreeDiskBytes, path=root), min_free_disk=min_free_disk, root=root)
    if problems:
        yield fail_host(f"llama.cpp build preflight failed on {host.name}: " + "; ".join(problems))
        return
    d = llama_dir(root)
    script = f"{d}/build.sh"
    yield from files.put._inner(src=str(BUILD_SCRIPT), dest=script, mode="755")
    env = {
        "GIT_URL": git_url, "COMMIT": commit, "TAG": tag, "HASH": flags_hash,
        "SRC_DIR": f"{d}/src", "BUILD_DIR": f"{d}/build", "PREFIX": f"{d}/{build}",
        "CMAKE_ARGS": " ".join(f"-D{k}={v}" for k, v in sorted(cmake_flags.items())),
        "LAUNCHER_ARGS": " ".join(launcher_args),
        "FLAGS_JSON": json.dumps(cmake_flags, sort_keys=True),
        "JOBS": str(jobs) if jobs else "",  # empty: build.sh picks from CPUs and RAM
    }
    if ccache_dir:
        env["CCACHE_DIR"] = ccache_dir
    if nvcc:
        env["CUDACXX"] = nvcc["path"]
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    yield StringCommand(f"{assigns} {shlex.quote(script)}")


@operation()
def switch(root: str, build: str):
    """
    Point ``ROOT/llama.cpp/current`` at the build ``build`` (atomically: a new link renamed over).

    + root: servefleet_root
    + build: an installed build's prefix name

    **Example:**

    .. code:: python

        llamacpp.switch(root="/opt/servefleet", build="b9784-0123abcd4567")
    """
    builds = host.get_fact(LlamaBuilds, root=root)
    d = llama_dir(root)
    target = f"{d}/{build}"
    if builds.current == target:
        host.noop(f"llama.cpp current is {build}")
        return
    t, tmp, cur = (shlex.quote(x) for x in (target, f"{d}/.current.new", f"{d}/current"))
    yield StringCommand(
        f"test -x {t}/bin/llama-server || {{ echo 'servefleet: no llama-server in {target}' >&2; "
        f"exit 1; }}; ln -sfn {t} {tmp} && mv -T {tmp} {cur}")


@operation()
def prune(root: str, keep: int, keep_names: list[str] = ()):
    """
    Remove the oldest llama.cpp builds so that ``keep`` remain (current is never removed).

    + root: servefleet_root
    + keep: how many builds to keep, current included
    + keep_names: builds never to remove (the one this run builds)

    **Example:**

    .. code:: python

        llamacpp.prune(root="/opt/servefleet", keep=3)
    """
    builds = host.get_fact(LlamaBuilds, root=root)
    old = builds_to_prune(builds, keep, tuple(keep_names))
    if not old:
        host.noop(f"{len(builds.records)} llama.cpp build(s), keeping up to {keep}")
        return
    d = llama_dir(root)
    yield StringCommand("rm -rf " + " ".join(shlex.quote(f"{d}/{n}") for n in old))


@operation()
def check_gguf(python: str, script: str, path: str):
    """
    Fail this host when the GGUF lint cannot read the model file (corrupt, truncated, missing).

    + python: the tools venv's python (has ``gguf``)
    + script: gguf_lint.py on the node
    + path: the .gguf file

    Before execution (first run: no file, no gguf yet) there is nothing to check.

    **Example:**

    .. code:: python

        llamacpp.check_gguf(python="/opt/servefleet/tools/venv/bin/python",
                            script="/opt/servefleet/tools/gguf_lint.py", path="/m/model.gguf")
    """
    from pyinfra import state

    lint = host.get_fact(GgufLint, python=python, script=script, path=path)
    if lint.state == "ok":
        host.noop(f"GGUF lint of {path}: " + (f"--override-kv {lint.flag}" if lint.flag else "no defect"))
    elif lint.state == "error":
        yield fail_host(f"GGUF lint of {path} failed: {lint.detail}")
    elif state.is_executing:
        yield fail_host(f"GGUF lint of {path}: {lint.state} (file or gguf missing after install)")
    else:
        host.noop(f"GGUF lint of {path}: after the download")


HEALTH_SCRIPT = r"""
deadline=$(( $(date +%s) + {timeout} ))
journal() {{  # the last start's lines (systemd's and the service's), else the last 60
    inv=$(systemctl show -p InvocationID --value {unit})
    out=$(journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$inv" + INVOCATION_ID="$inv" 2>/dev/null | tail -n 80)
    [ -n "$inv" ] && [ -n "$out" ] || out=$(journalctl -u {unit} -n 60 --no-pager -o cat)
    printf '%s\n' "$out" >&2
}}
while :; do
    code=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {url} || true)
    if [ "$code" = 200 ]; then echo "servefleet: {url} answered 200"; exit 0; fi
    sub=$(systemctl show -p SubState --value {unit})
    case "$sub" in failed|auto-restart|dead)
        journal; echo "servefleet: {unit} is $sub: it exited before becoming healthy (journal above)" >&2
        exit 1;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        journal; echo "servefleet: {url} not healthy after {timeout} s (last HTTP status $code)" >&2
        exit 1
    fi
    sleep 1
done
"""


@operation()
def wait_healthy(url: str, unit: str, timeout_s: int = 600):
    """
    Wait until ``url`` answers 200; fail this host with the unit's journal if it exits or times out.

    + url: the health endpoint, e.g. http://127.0.0.1:8080/health
    + unit: the systemd unit serving it
    + timeout_s: how long loading may take

    Always runs a command: guard it with ``_if=`` (the service was (re)started in this run).

    **Example:**

    .. code:: python

        llamacpp.wait_healthy(url="http://127.0.0.1:8080/health", unit="servefleet-llama.service",
                              _if=svc.started)
    """
    yield StringCommand(HEALTH_SCRIPT.format(timeout=int(timeout_s), unit=shlex.quote(unit),
                                             url=shlex.quote(url)))


SMOKE_SCRIPT = r"""
body='{{"model": {model}, "messages": [{{"role": "user", "content": "Say hello."}}], "max_tokens": 8, "temperature": 0}}'
auth=""
if [ -n {keyfile} ]; then auth="Authorization: Bearer $(cat {keyfile})"; fi
out=$(curl -sS --max-time {timeout} -H 'Content-Type: application/json' ${{auth:+-H "$auth"}} \
      -d "$body" {url}) || {{ echo "servefleet: chat completion request failed" >&2; exit 1; }}
printf '%s' "$out" | python3 -c '
import json, sys
raw = sys.stdin.read()
try:
    reply = json.loads(raw)["choices"][0]["message"]
except Exception:
    sys.exit("servefleet: chat completion smoke test failed: " + raw[:500])
print("servefleet: smoke test reply:", json.dumps(reply.get("content") or reply.get("reasoning_content")))
'
"""


@operation()
def smoke_chat(url: str, model: str, api_key_file: str | None = None, timeout_s: int = 300):
    """
    One chat completion against the OpenAI-compatible API; fail this host when no choice comes back.

    + url: the chat completions endpoint, e.g. http://127.0.0.1:8080/v1/chat/completions
    + model: the served model name (llama-server's --alias)
    + api_key_file: node-side file with the API key, or None
    + timeout_s: time allowed for the answer

    Always runs a command: guard it with ``_if=``.

    **Example:**

    .. code:: python

        llamacpp.smoke_chat(url="http://127.0.0.1:8080/v1/chat/completions", model="qwen",
                            _if=svc.started)
    """
    yield StringCommand(SMOKE_SCRIPT.format(
        model=json.dumps(model).replace("'", ""), keyfile=shlex.quote(api_key_file or ""),
        timeout=int(timeout_s), url=shlex.quote(url)))
