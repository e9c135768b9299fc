"""Engine answers: the node-side readers of a serving engine (the health check, the bench, and
through the bench the performance gate) against a hostile engine. A scripted engine on
127.0.0.1 (a raw socket server) answers each request with exactly the bytes the case says:
dripping headers, 101 header lines, endless streams, lines without end, deep nesting, wrong
types, NaN / 1e999 / negative / missing usage, a redirect to another origin.

The scripts run as the node runs them: copied into a bin/ directory under their node names
beside bin/engine_client.py (the shared reader, servefleet.recipes.serving.ENGINE_CLIENT) and
started with `python -I`. Each case checks the one-line outcome, that the run ended within its
deadline (plus a little), and for the bench that the performance gate (perfgate.measure and
perfgate.decide, the rollout's own rule) did not pass and kept no figures.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from servefleet.core import perf
from servefleet.recipes import serving
from servefleet.verbs import bench, perfgate
from tests.hostile.table import harmless, refused

CATEGORY = "engine answers"
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-hostile-engine-key-0123456789"
TIMEOUT = 2  # the deadline each run is given (seconds)
SLACK = 2.5  # interpreter start, the last probe's sleep, a loaded CI machine
MAX_TOKENS = 8


# --- the scripted engine ---------------------------------------------------------------------


class Engine:
    """A raw HTTP engine on 127.0.0.1: every request is read (line, headers, body) and recorded
    in .seen, then answered by routes[path](conn, request) writing exactly its bytes."""

    def __init__(self, routes):
        self.routes, self.seen, self.stopped = routes, [], threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 1 << 16:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            line, *lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)
            }
            length = int(headers.get("content-length") or 0)
            while len(body) < length:
                body += conn.recv(65536)
            method, path, _ = line.split(" ", 2)
            request = SimpleNamespace(
                method=method,
                path=path,
                headers=headers,
                body=json.loads(body) if body else None,
                engine=self,
            )
            self.seen.append(request)
            self.routes.get(path, not_found)(conn, request)
        except OSError:
            pass  # the reader hung up: what a bounded reader does
        finally:
            conn.close()

    def close(self):
        self.stopped.set()
        self.sock.close()


def answer(conn, status=200, body=b"", headers=(), length=True):
    head = [f"HTTP/1.1 {status} X", "Connection: close", *headers]
    if length:
        head.append(f"Content-Length: {len(body)}")
    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)


def not_found(conn, request):
    answer(conn, 404, b'{"error": "not found"}')


def healthy(conn, request):
    answer(conn, 200)


def tokenize(conn, request):
    answer(conn, 200, json.dumps({"tokens": list(range(50))}).encode())


def chat_doc(content="Hello"):
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def chat_ok(conn, request):
    answer(conn, 200, json.dumps(chat_doc()).encode())


def endless(conn, piece, every=0.0, stop=None):
    """`piece` again and again until the reader hangs up (or the engine stops)."""
    stop = stop or threading.Event()
    while not stop.is_set():
        conn.sendall(piece)
        if every:
            time.sleep(every)


def events(chunks, usage="normal"):
    """An event stream's bytes: one content chunk per token, then the usage chunk, [DONE]."""
    out = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
    if usage == "normal":
        usage = {"prompt_tokens": 20, "completion_tokens": len(chunks)}
    if usage is not None:
        out.append(
            b"data: "
            + (
                usage
                if isinstance(usage, bytes)
                else json.dumps({"choices": [], "usage": usage}).encode()
            )
            + b"\n\n"
        )
    return b"".join(out) + b"data: [DONE]\n\n"


def token(text="x"):
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def stream_of(body_bytes):
    """A chat route streaming exactly these bytes (the connection closes at the end)."""

    def route(conn, request):
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        conn.sendall(
            head.encode() + body_bytes(request)
            if callable(body_bytes)
            else head.encode() + body_bytes
        )

    return route


def routes(**over):
    base = {"/health": healthy, "/tokenize": tokenize, "/v1/chat/completions": chat_ok}
    base.update(
        {
            "/" + k.replace("__", "/").replace("_", "-") if not k.startswith("/") else k: v
            for k, v in over.items()
        }
    )
    return base


# --- the scripts, as the node runs them ------------------------------------------------------

_BIN = []


def node_bin() -> Path:
    """bin/ as the recipes and the bench leave it: the scripts under their node names and the
    reader beside them."""
    if not _BIN:
        path = Path(tempfile.mkdtemp(prefix="servefleet-hostile-bin-")) / "bin"
        path.mkdir()
        shutil.copy(REPO / serving.HEALTH_SCRIPT, path / "servefleet-health")
        shutil.copy(REPO / bench.SCRIPT, path / "servefleet-stream-bench")
        shutil.copy(REPO / serving.ENGINE_CLIENT, path / serving.ENGINE_CLIENT_NAME)
        (path / "api-key").write_text(KEY + "\n")
        _BIN.append(path)
    return _BIN[0]


def run_script(name, args, budget):
    """(returncode, stdout, stderr, seconds) of bin/<name> under python -I."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-I", str(node_bin() / name), *args],
        capture_output=True,
        text=True,
        timeout=budget + 30,
    )
    seconds = time.monotonic() - started
    return done.returncode, done.stdout, done.stderr, seconds


def health_of(engine_routes, timeout=TIMEOUT, check=None):
    """The health check against the scripted engine: its one-line problem (None when it
    passed). It must fail with exit 1, end within its deadline, and say one line per problem."""

    def attempt():
        engine = Engine(engine_routes)
        try:
            rc, out, err, seconds = run_script(
                "servefleet-health",
                [
                    "--url",
                    engine.url,
                    "--model",
                    "m",
                    "--timeout",
                    str(timeout),
                    "--key-file",
                    str(node_bin() / "api-key"),
                ],
                timeout,
            )
        finally:
            engine.close()
        assert seconds < timeout + SLACK, f"the check ran {seconds:.1f} s, deadline {timeout} s"
        if rc == 0:
            return None
        assert rc == 1, (rc, err[-500:])
        report = json.loads(out.strip().splitlines()[-1])
        lines = [line for line in err.splitlines() if line.startswith("servefleet: health: ")]
        said = [line[len("servefleet: health: ") :] for line in lines]
        assert len(lines) == 1 and report["problems"] == said, err
        assert KEY not in out + err
        if check:
            check(engine, report)
        return err

    return attempt


def gate_of(chat_route, tokenize_route=tokenize, max_tokens=MAX_TOKENS):
    """The performance gate (perfgate.decide over perfgate.measure, as a rollout runs them) with
    the bench against the scripted engine: the bench's one line (None when the gate passed).
    The gate must be inconclusive, keep no figures, and each bench run end within its
    deadline."""

    def attempt():
        engine = Engine(routes(v1__chat__completions=chat_route, tokenize=tokenize_route))
        runs = []

        def bench_on_node(host, n, prompt_tokens, tokens, unit=None):
            rc, out, err, seconds = run_script(
                "servefleet-stream-bench",
                [
                    "--url",
                    engine.url,
                    "--runs",
                    str(n),
                    "--warmup",
                    "0",
                    "--prompt-tokens",
                    str(prompt_tokens),
                    "--max-tokens",
                    str(tokens),
                    "--timeout",
                    str(TIMEOUT),
                    "--api-key-file",
                    str(node_bin() / "api-key"),
                ],
                TIMEOUT,
            )
            assert seconds < TIMEOUT + SLACK, f"the bench ran {seconds:.1f} s, deadline {TIMEOUT} s"
            assert "Traceback" not in err, err[-800:]
            runs.append((rc, err))
            return bench.read_result(host.name, {}, rc == 0, out, err)

        data = {
            "perf_gate_runs": 1,
            "perf_gate_prompt_tokens": 16,
            "perf_gate_max_tokens": max_tokens,
            "perf_gate_decode_drop_pct": 10,
            "perf_gate_ttft_rise_pct": 25,
            "perf_gate_recheck_pct": 5,
        }
        host = SimpleNamespace(name="node-1", data=SimpleNamespace(dict=lambda: data))
        before = perf.Figures(decode_tok_s=40.0, ttft_s=0.2)
        real, perfgate.bench_host = perfgate.bench_host, bench_on_node
        try:
            state, said, after, _ = perfgate.decide(
                before,
                perf.Settings.of(data).thresholds,
                lambda: perfgate.measure(host, "gate", "r-1"),
                lambda line: None,
            )
        finally:
            perfgate.bench_host = real
            engine.close()
        if state == perf.PASS:
            return None
        assert state == perf.INCONCLUSIVE and after is None, (state, said)
        assert len(runs) == 2, "measured once more before the verdict"
        assert said.startswith("performance gate inconclusive: the bench failed: "), said
        assert "\n" not in said and KEY not in said
        return said

    return attempt


def bench_harmless(chat_route, tokenize_route, proof):
    """A bench that must pass (rc 0, both figures) within its deadline; proof(result) checks
    what it says."""

    def check():
        engine = Engine(routes(v1__chat__completions=chat_route, tokenize=tokenize_route))
        try:
            rc, out, err, seconds = run_script(
                "servefleet-stream-bench",
                [
                    "--url",
                    engine.url,
                    "--runs",
                    "2",
                    "--warmup",
                    "0",
                    "--prompt-tokens",
                    "16",
                    "--max-tokens",
                    str(MAX_TOKENS),
                    "--timeout",
                    str(TIMEOUT),
                ],
                TIMEOUT,
            )
        finally:
            engine.close()
        assert rc == 0 and seconds < TIMEOUT + SLACK, (rc, seconds, err[-500:])
        result = json.loads(out)
        res = bench.read_result("node-1", {}, True, out, err)
        assert res.ok and res.median_decode_tok_s and res.median_ttft_s, res
        assert proof(result), result

    return check


# --- hostile answers -------------------------------------------------------------------------


def drip_headers(conn, request):
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    endless(conn, b"X", every=1.0, stop=request.engine.stopped)


def many_headers(conn, request):
    answer(conn, 200, b"{}", [f"X-Filler-{i}: {i}" for i in range(101)])


def drip_body(conn, request):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{")
    endless(conn, b" ", every=0.5, stop=request.engine.stopped)


def endless_body(conn, request):
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    endless(conn, b"[" + b"1," * 32767, stop=request.engine.stopped)


def deep(conn, request):
    answer(conn, 200, b'{"choices": ' + b"[" * 100000 + b"]" * 100000 + b"}")


def wrong_type(conn, request):
    answer(conn, 200, json.dumps(chat_doc(content=42)).encode())


def nan_answer(conn, request):
    answer(
        conn,
        200,
        b'{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": NaN}}',
    )


def redirect_elsewhere(conn, request):
    answer(conn, 307, b"", [f"Location: {request.engine.elsewhere}/v1/chat/completions"])


def health_redirected():
    """The chat is redirected to another origin, which records whatever reaches it: the key
    must never get there (the redirect is not followed)."""
    thief = Engine(routes())

    def route(conn, request):
        request.engine.elsewhere = thief.url
        redirect_elsewhere(conn, request)

    def check(engine, report):
        time.sleep(0.2)
        assert not thief.seen, [(r.path, r.headers.get("authorization")) for r in thief.seen]
        thief.close()
        chat = [r for r in engine.seen if r.path == "/v1/chat/completions"]
        assert chat and chat[0].headers.get("authorization") == f"Bearer {KEY}"

    return health_of(routes(v1__chat__completions=route), check=check)


def error_endless(conn, request):
    conn.sendall(b"HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\n")
    endless(conn, b"E" * 65536, stop=request.engine.stopped)


def slow_stream(conn, request):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    endless(
        conn, f"data: {json.dumps(token())}\n\n".encode(), every=0.1, stop=request.engine.stopped
    )


def long_line(conn, request):
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        b'data: {"choices": [{"delta": {"content": "'
    )
    endless(conn, b"a" * 65536, stop=request.engine.stopped)  # a 200 MB line, and more


def endless_tokenize(conn, request):
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    endless(conn, b'{"tokens": [' + b"1," * 32767, stop=request.engine.stopped)


def good_stream(request):
    return events([token() for _ in range(MAX_TOKENS)])


def usage_of(usage):
    return stream_of(lambda request: events([token() for _ in range(MAX_TOKENS)], usage))


def shaped(*chunks):
    return stream_of(lambda request: events(list(chunks)))


def no_usage_proof():
    """Missing usage: the bench ends (rc 0) with decode null and says why; the gate reads
    that as not measured."""
    return gate_of(usage_of(None))


CASES = [
    # the health check: one deadline for connect, headers and body; 100 header lines
    refused(
        CATEGORY,
        "/health drips its headers one byte a second",
        "no complete answer within 2 s",
        health_of(routes(health=drip_headers)),
    ),
    refused(
        CATEGORY,
        "/health answers 101 header lines",
        "more than 100 header lines",
        health_of(routes(health=many_headers)),
    ),
    refused(
        CATEGORY,
        "the chat answer drips its body (held to --timeout, not 300 s)",
        "chat completion: no complete answer within 2 s",
        health_of(routes(v1__chat__completions=drip_body)),
    ),
    refused(
        CATEGORY,
        "a chat answer without end",
        "the answer is larger than 1048576 bytes",
        health_of(routes(v1__chat__completions=endless_body)),
    ),
    refused(
        CATEGORY,
        "a chat answer nested 100,000 levels deep",
        "nests deeper than 64 levels",
        health_of(routes(v1__chat__completions=deep)),
    ),
    refused(
        CATEGORY,
        "a chat answer whose content is a number",
        "'content': expected a string, got an integer",
        health_of(routes(v1__chat__completions=wrong_type)),
    ),
    refused(
        CATEGORY,
        "a chat answer with NaN in it",
        "NaN is not a JSON number",
        health_of(routes(v1__chat__completions=nan_answer)),
    ),
    refused(
        CATEGORY,
        "the chat redirected to another origin (the key must not follow)",
        "HTTP 307 (a redirect to",
        health_redirected(),
    ),
    refused(
        CATEGORY,
        "an error answer without end",
        "chat completion: HTTP 500 'EEEE",
        health_of(routes(v1__chat__completions=error_endless)),
    ),
    # the bench, and through it the performance gate
    refused(
        CATEGORY,
        "an endless event stream, one event every 0.1 s",
        "no complete answer within 2 s",
        gate_of(slow_stream),
    ),
    refused(
        CATEGORY,
        "a stream line without end (a 200 MB line)",
        "a line longer than 1048576 bytes",
        gate_of(long_line),
    ),
    refused(
        CATEGORY,
        "a stream chunk nested 100,000 levels deep",
        "nests deeper than 64 levels",
        gate_of(stream_of(b"data: " + b"[" * 100000 + b"]" * 100000 + b"\n\n")),
    ),
    refused(
        CATEGORY,
        "an error answer to the stream without end",
        "HTTP 500 'EEEE",
        gate_of(error_endless),
    ),
    refused(
        CATEGORY,
        "usage with NaN completion tokens",
        "NaN is not a JSON number",
        gate_of(usage_of(b'{"choices": [], "usage": {"completion_tokens": NaN}}')),
    ),
    refused(
        CATEGORY,
        "usage with 1e999 completion tokens",
        "the number 1e999 is out of range",
        gate_of(usage_of(b'{"choices": [], "usage": {"completion_tokens": 1e999}}')),
    ),
    refused(
        CATEGORY,
        "usage with negative completion tokens",
        "'completion_tokens': -8 is out of range",
        gate_of(usage_of({"completion_tokens": -8})),
    ),
    refused(
        CATEGORY,
        "usage claiming more tokens than were asked (a faster decode)",
        "'completion_tokens': 100000 is out of range (0..8)",
        gate_of(usage_of({"completion_tokens": 100000})),
    ),
    refused(
        CATEGORY,
        "usage whose completion tokens are true",
        "'completion_tokens': expected an integer, got a boolean",
        gate_of(usage_of({"completion_tokens": True})),
    ),
    refused(
        CATEGORY,
        "usage whose completion tokens are 8.0",
        "'completion_tokens': expected an integer, got a number",
        gate_of(usage_of({"completion_tokens": 8.0})),
    ),
    refused(
        CATEGORY,
        "no usage in the stream: decode cannot be measured",
        "not measured: decode: the stream sent no usage",
        no_usage_proof(),
    ),
    refused(
        CATEGORY,
        "usage that is a string",
        "'usage': expected an object, got a string",
        gate_of(usage_of(b'{"choices": [], "usage": "lots"}')),
    ),
    refused(
        CATEGORY,
        "a stream chunk that is a list",
        "a chunk: expected an object, got a list",
        gate_of(shaped(*[[1, 2]] * MAX_TOKENS)),
    ),
    refused(
        CATEGORY,
        "choices that are an object",
        "'choices': expected a list, got an object",
        gate_of(shaped(*[{"choices": {"0": {}}}] * MAX_TOKENS)),
    ),
    refused(
        CATEGORY,
        "a delta that is a string",
        "'delta': expected an object, got a string",
        gate_of(shaped(*[{"choices": [{"delta": "x"}]}] * MAX_TOKENS)),
    ),
    refused(
        CATEGORY,
        "a content that is a list",
        "'content': expected a string, got a list",
        gate_of(shaped(*[{"choices": [{"delta": {"content": ["x"]}}]}] * MAX_TOKENS)),
    ),
    refused(
        CATEGORY,
        "a stream that is not JSON",
        "the answer is not valid JSON",
        gate_of(stream_of(b"data: {choices: [}\n\n")),
    ),
    refused(
        CATEGORY,
        "a stream with no content: TTFT cannot be measured",
        "not measured: TTFT: the stream sent no content",
        gate_of(stream_of(lambda request: events([], {"completion_tokens": 8}))),
    ),
    harmless(
        CATEGORY,
        "a /tokenize answer without end",
        "cut at 1 MiB; the bench sizes its prompt without it, says why, and measures",
        bench_harmless(
            stream_of(good_stream),
            endless_tokenize,
            lambda r: "larger than 1048576 bytes" in r["prompt_sizing"],
        ),
    ),
    harmless(
        CATEGORY,
        "a well-behaved engine (the control)",
        "the bench measures both figures through the same reader",
        bench_harmless(
            stream_of(good_stream),
            tokenize,
            lambda r: r["unmeasured"] == [] and r["prompt_sizing"] == "the server's tokenizer",
        ),
    ),
]


# --- redirects never carry the key; the engine's words reach the operator escaped ---------------


def redirected(status: int, path: str = "/v1/chat/completions", to=lambda thief: thief.url):
    """`path` answers `status` with a Location on another origin (a recording thief engine, or
    to(thief)): the check fails in one line, and nothing (the key least of all) reaches the
    thief."""
    thief = Engine(routes())

    def route(conn, request):
        location = to(thief) + (path if to(thief).startswith("http") else "")
        answer(conn, status, b"", [f"Location: {location}"])

    def check(engine, report):
        time.sleep(0.2)
        seen = [(r.path, r.headers.get("authorization")) for r in thief.seen]
        thief.close()
        assert not seen, seen

    return health_of(routes(**{path: route}), check=check)


def no_escape_gets_through(attempt_of):
    """attempt_of's one line, asserting that it holds no control character (ESC, CR, BEL)."""

    def attempt():
        message = attempt_of()
        assert message is not None
        line = message.strip()
        assert not any(ord(ch) < 32 or 0x7F <= ord(ch) <= 0x9F for ch in line), repr(line)
        return line

    return attempt


def escape_in_reason(conn, request):
    conn.sendall(
        b"HTTP/1.1 500 \x1b[2J\x1b]0;owned\x07\r\nContent-Length: 9\r\n\r\n\x1b[31mred\r\n"
    )


CASES += [
    refused(
        CATEGORY,
        f"the chat answers {s} to another origin",
        f"HTTP {s} (a redirect to",
        redirected(s),
    )
    for s in (301, 302, 303, 308)
] + [
    refused(
        CATEGORY,
        "the chat redirected to the same address on another port (another origin)",
        "(a redirect to",
        redirected(307, to=lambda thief: thief.url.replace("127.0.0.1", "localhost")),
    ),
    refused(
        CATEGORY,
        "the chat redirected to https on the same host",
        "(a redirect to",
        redirected(302, to=lambda thief: thief.url.replace("http://", "https://")),
    ),
    refused(
        CATEGORY,
        "the chat redirected to a path on its own origin (not followed either)",
        "(a redirect to '/v1/elsewhere', not followed)",
        redirected(302, to=lambda thief: "/v1/elsewhere"),
    ),
    refused(
        CATEGORY,
        "a redirect whose Location holds terminal escapes",
        "\\x1b]0;owned\\x07",
        no_escape_gets_through(
            redirected(302, to=lambda thief: "http://evil.example/\x1b]0;owned\x07\x1b[2J")
        ),
    ),
    refused(
        CATEGORY,
        "an error answer whose status text and body hold terminal escapes",
        "HTTP 500",
        no_escape_gets_through(health_of(routes(v1__chat__completions=escape_in_reason))),
    ),
    refused(
        CATEGORY,
        "the bench's stream redirected to another origin",
        "HTTP 302",
        gate_of(
            lambda conn, request: answer(
                conn, 302, b"", ["Location: http://localhost:9/v1/chat/completions"]
            )
        ),
    ),
]
