"""The GGUF lint's overrides against the real llama.cpp loader: a CPU llama-server on tiny GGUFs.

llama-server comes from `llama_host_build()`: built once into ~/.cache/servefleet (first run
~8.5 min on 2 cores), reused afterwards. Servers bind 127.0.0.1 on a free port only.
"""

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from servefleet.lint.gguf_lint import lint_gguf, override_kv_flag
from servefleet.testing.llama_build import llama_host_build
from servefleet.testing.tiny_models import (
    GGUF_CLEAN, GGUF_MISSING_MTP, GGUF_MTP, GGUF_UNCOUNTED, build_tiny_gguf,
)

START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def llama_server():
    return llama_host_build()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {layout: build_tiny_gguf(root / f"{layout}.gguf", layout=layout)
            for layout in (GGUF_CLEAN, GGUF_MTP, GGUF_MISSING_MTP, GGUF_UNCOUNTED)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict | str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
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
            [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
             "-c", "512", "-np", "1", "-t", "2", "--no-warmup", "--no-webui", *extra],
            stdout=self._log, stderr=subprocess.STDOUT,
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
        raise TimeoutError(f"llama-server neither healthy nor exited in {START_TIMEOUT_S}s: {self.log()}")

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


@pytest.fixture
def serve(llama_server, tmp_path):
    servers = []

    def start(model, *extra):
        server = Server(llama_server, model, tmp_path / f"server-{len(servers)}.log", extra)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def chat(port: int) -> dict:
    status, body = http(port, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "You are a node."}, {"role": "user", "content": "hello"}],
        "max_tokens": 8, "temperature": 0, "seed": 1,
    })
    assert status == 200, body
    return body


def test_defective_gguf_fails_without_overrides(serve, tiny):
    server = serve(tiny[GGUF_MISSING_MTP])
    assert not server.healthy
    assert server.proc.returncode != 0
    assert "tensor 'blk.4.attn_norm.weight' not found" in server.log()


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
    server = serve(tiny[GGUF_MISSING_MTP], "--override-kv", "qwen35moe.block_count=int:4")
    assert not server.healthy
    assert "tensor 'blk.3.nextn.eh_proj.weight' not found" in server.log()


def test_uncounted_blocks_fail_and_the_block_count_override_fixes_them(serve, tiny):
    lint = lint_gguf(tiny[GGUF_UNCOUNTED])
    broken = serve(tiny[GGUF_UNCOUNTED])
    assert not broken.healthy
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
