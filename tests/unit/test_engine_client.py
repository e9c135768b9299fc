"""The node-side engine reader (files/engine_client/engine_client.py) on well-formed answers
(chunked, Content-Length, closed-delimited), its strict types, and how the bench ships it: the
hostile answers are tests/hostile/cases_engine_answers.py."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from servefleet.core.releases import Releases
from servefleet.recipes import serving
from servefleet.verbs import bench

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("engine_client", REPO / serving.ENGINE_CLIENT)
ec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ec)


def one_answer(raw: bytes) -> str:
    """A server on 127.0.0.1 that answers one request with exactly `raw`; its URL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            conn.sendall(raw)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}"


def test_a_chunked_event_stream_is_read_line_by_line_across_chunks():
    body = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 5]), body[i : i + 5]) for i in range(0, len(body), 5)
    )
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    url = one_answer(head + chunks + b"0\r\n\r\n")
    answer = ec.request(url, "POST", "/v1/chat/completions", ec.Deadline(5), {"x": 1})
    assert list(answer.expect(200).lines()) == [b'data: {"a": 1}', b"", b"data: [DONE]", b""]
    answer.close()


def test_a_content_length_answer_is_parsed_strictly():
    doc = json.dumps({"tokens": [1, 2, 3], "f": 0.5}).encode()
    url = one_answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(doc), doc))
    answer = ec.request(url, "POST", "/tokenize", ec.Deadline(5), {})
    assert answer.json() == {"tokens": [1, 2, 3], "f": 0.5}


def test_nothing_listening_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ec.EngineError, match=r"^/health: cannot connect to 127\.0\.0\.1:\d+"):
        ec.request(f"http://127.0.0.1:{port}", "GET", "/health", ec.Deadline(2), what="/health")


@pytest.mark.parametrize("url", ["https://127.0.0.1:8000", "file:///etc/passwd", "http://"])
def test_only_plain_http_urls_are_spoken(url):
    with pytest.raises(ec.EngineError, match="not an http:// URL"):
        ec.split_url(url)


def test_strict_types():
    assert ec.count(8, "n", 0, 8) == 8
    for bad, said in (
        (True, "got a boolean"),
        (8.0, "got a number"),
        (9, "out of range"),
        (-1, "out of range"),
        ("8", "got a string"),
    ):
        with pytest.raises(ec.EngineError, match=said):
            ec.count(bad, "n", 0, 8)
    for bad in (float("inf"), float("nan"), True, None):
        with pytest.raises(ec.EngineError):
            ec.number(bad, "x")
    for text in (b"NaN", b"Infinity", b"-1e999", b"1" * 40, b"\xff"):
        with pytest.raises(ec.EngineError):
            ec.loads(text, "x")


def test_the_bench_ships_the_reader_beside_itself_and_gives_it_a_deadline(monkeypatch):
    puts, commands = [], []
    monkeypatch.setattr(
        bench, "put", lambda state, host, dest, content, **kw: puts.append((dest, content)) or True
    )
    result = {
        "runs": [{"ttft_s": 0.1, "decode_tok_s": 50.0}],
        "median_ttft_s": 0.1,
        "median_decode_tok_s": 50.0,
        "prompt_tokens": 20,
        "unmeasured": [],
    }
    monkeypatch.setattr(
        bench, "run", lambda host, cmd: commands.append(cmd) or (True, json.dumps(result), "")
    )
    data = {
        "servefleet_root": "/opt/servefleet",
        "service_host": "127.0.0.1",
        "service_port": 8000,
        "python_interpreter": "python3",
    }
    host = SimpleNamespace(
        name="n1",
        state=None,
        data=SimpleNamespace(dict=lambda: data),
        get_fact=lambda cls, **kw: Releases(),  # no release recorded: no cgroup to read
    )
    monkeypatch.setattr(bench, "python", lambda: "python3")
    res = bench.bench_host(host, 1, 16, 8)
    assert res.ok and res.median_decode_tok_s == 50.0, res
    assert [d for d, _ in puts] == [
        "/opt/servefleet/bin/engine_client.py",
        "/opt/servefleet/bin/servefleet-stream-bench",
    ]
    assert puts[0][1] == (REPO / serving.ENGINE_CLIENT).read_bytes()
    assert f"--timeout {bench.BENCH_TIMEOUT_S}" in commands[0]


@pytest.mark.parametrize(
    "raw, said",
    [
        (
            {
                "runs": [],
                "median_ttft_s": 0.1,
                "median_decode_tok_s": None,
                "unmeasured": ["decode: the stream sent no usage (completion_tokens)"],
            },
            "not measured: decode: the stream sent no usage",
        ),
        ({"runs": [], "median_ttft_s": 0.1, "median_decode_tok_s": -3.0}, "no decode tok/s"),
        ({"runs": [], "median_ttft_s": None, "median_decode_tok_s": 9.0}, "no TTFT"),
    ],
)
def test_a_figure_the_bench_could_not_measure_is_no_result(raw, said):
    res = bench.read_result("n1", {}, True, json.dumps(raw), "")
    assert not res.ok and said in res.error


def test_nan_in_the_bench_line_is_no_result():
    res = bench.read_result("n1", {}, True, '{"runs": [], "median_ttft_s": NaN}', "")
    assert not res.ok and "NaN is not a JSON number" in res.error
