"""Hub answers: servefleet's operator-side hub client (servefleet.core.models.hub_commit) against
a hostile hub. A scripted HTTP server on 127.0.0.1 answers each request as the case says; the
client must refuse with one line (HubError) within its deadline, never loop, never read without
bound, and never send the token to another origin.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

from servefleet.core.models import HubError, hub_commit
from tests.hostile.table import refused

CATEGORY = "hub answers"
SHA = "a" * 40
TOKEN = "hf_hostiletokenhostiletoken"
TIMEOUT = 2.0


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers every request with server.script(handler); records what it saw."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        self.server.script(self)

    def log_message(self, *args):
        pass


def serve(script):
    """A server running `script` for each request; returns (base URL, server)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.script, server.seen, server.daemon_threads = script, [], True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def send(h, status=200, body=b"", headers=()):
    h.send_response(status)
    for k, v in headers:
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def attempt(script, revision="main", check_server=None):
    """Run hub_commit against the scripted hub; the one-line error, or None when accepted."""

    def run():
        base, server = serve(script)
        started = time.monotonic()
        try:
            hub_commit.cache_clear()
            hub_commit(base, "acme/tiny", revision, TOKEN, TIMEOUT)
        except HubError as exc:
            message = str(exc)
            assert "\n" not in message and TOKEN not in message, message
            assert time.monotonic() - started < 4 * TIMEOUT + 2, "refused too late"
            if check_server:
                check_server(server)
            return message
        finally:
            server.shutdown()
            server.server_close()
        return None

    return run


def json_answer(doc, link=None):
    def script(h):
        send(
            h,
            body=json.dumps(doc).encode() if not isinstance(doc, bytes) else doc,
            headers=[("Link", link)] if link else [],
        )

    return script


def tree_then(doc, link_of=None):
    """revision -> SHA, then the tree answers `doc` (with a Link header from link_of(path))."""

    def script(h):
        if "/revision/" in h.path:
            send(h, body=json.dumps({"sha": SHA}).encode())
        else:
            link = link_of(h) if link_of else None
            send(h, body=json.dumps(doc).encode(), headers=[("Link", link)] if link else [])

    return script


def case(name, expected, script, **kw):
    return refused(CATEGORY, name, expected, attempt(script, **kw))


def _no_token_elsewhere(server):
    # The token went to the hub's own origin only; the other origin was never asked.
    assert all(auth in (None, f"Bearer {TOKEN}") for _, auth in server.seen)


_other = {}


def _redirect_elsewhere(h):
    if "other" not in _other:
        base, srv = serve(lambda h2: send(h2, body=json.dumps({"sha": SHA}).encode()))
        _other["other"] = (base.replace("127.0.0.1", "localhost"), srv)
    send(h, 302, headers=[("Location", _other["other"][0] + h.path)])


def _drip(h):
    h.send_response(200)
    h.send_header("Content-Length", "1000")
    h.end_headers()
    for _ in range(20):
        try:
            h.wfile.write(b" ")
            h.wfile.flush()
        except OSError:
            return
        time.sleep(0.4)


def _huge(h):
    h.send_response(200)
    h.send_header("Content-Length", str(70 * 1024**2))
    h.end_headers()
    block = b" " * 1024**2
    try:
        for _ in range(70):
            h.wfile.write(block)
    except OSError:
        pass


CASES = [
    case("sha is a number", "has no commit sha", json_answer({"sha": 5})),
    case("sha is a list", "has no commit sha", json_answer({"sha": [SHA]})),
    case("sha is NaN", "is not JSON (NaN is not JSON)", json_answer(b'{"sha": NaN}')),
    case("the answer is a string", "has no commit sha", json_answer("main")),
    case("10,000 levels of nesting", "nested too deep", json_answer(b"[" * 10000 + b"]" * 10000)),
    case(
        "a redirect to another origin",
        "redirected to another origin",
        _redirect_elsewhere,
        check_server=_no_token_elsewhere,
    ),
    case("a body that drips one byte at a time", "took longer than", _drip),
    case("a 70 MB answer", "larger than", _huge),
    case(
        "a next page that is itself",
        "pages in a loop",
        tree_then([], link_of=lambda h: f'<http://{h.headers["Host"]}{h.path}>; rel="next"'),
        revision=SHA,
    ),
    case(
        "a next page on another host",
        "is not on",
        tree_then([], link_of=lambda h: '<http://evil.example/x>; rel="next"'),
        revision=SHA,
    ),
    case("a file list that is a dict", "is not a list", tree_then({"a": 1}), revision=SHA),
    case(
        "a file with a path out of the directory",
        "not a plain relative path",
        tree_then([{"type": "file", "path": "../../etc/passwd", "size": 1}]),
        revision=SHA,
    ),
    case(
        "a file with a size of true",
        "with size True",
        tree_then([{"type": "file", "path": "a.json", "size": True}]),
        revision=SHA,
    ),
    case(
        "a file with a 5,000-character path",
        "not a plain relative path",
        tree_then([{"type": "file", "path": "a" * 5000, "size": 1}]),
        revision=SHA,
    ),
    case(
        "a file 40 directories deep",
        "not a plain relative path",
        tree_then([{"type": "file", "path": "d/" * 40 + "a.json", "size": 1}]),
        revision=SHA,
    ),
    case(
        "a file with a 255-character name",
        "not a plain relative path",
        tree_then([{"type": "file", "path": "x/" + "n" * 255, "size": 1}]),
        revision=SHA,
    ),
    case(
        "a file with a numeric oid",
        "with oid '5'",
        tree_then([{"type": "file", "path": "a.json", "size": 1, "oid": 5}]),
        revision=SHA,
    ),
]


# --- one deadline for the whole answer, and the hub's words escaped (#27 single cases) -----------


def _drip_bytes(data: bytes, every: float = 0.25):
    """A script writing `data` one byte every `every` seconds (until the client hangs up)."""

    def script(h):
        for i in range(len(data)):
            try:
                h.wfile.write(data[i : i + 1])
                h.wfile.flush()
            except OSError:
                return
            time.sleep(every)

    return script


def on_time(script, within: float = TIMEOUT + 1.5):
    """hub_commit refused within the deadline (plus a margin), not per-byte timeouts later."""

    def run():
        started = time.monotonic()
        message = attempt(script)()
        took = time.monotonic() - started
        assert took < within, f"refused after {took:.1f} s; the deadline is {TIMEOUT} s"
        return message

    return run


HEADERS = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 60 + b"\r\nContent-Length: 2\r\n\r\n{}"


def _error_code(value: bytes, status: int = 404):
    """An error answer whose X-Error-Code header holds `value` as raw bytes."""

    def script(h):
        h.wfile.write(
            b"HTTP/1.1 %d Nope\r\nX-Error-Code: %s\r\nContent-Length: 0\r\n\r\n" % (status, value)
        )

    return script


def escaped(value: bytes, shown: str):
    """The hub's X-Error-Code reaches the message escaped: no ESC, CR or C1 byte gets through."""

    def run():
        message = attempt(_error_code(value))()
        assert message is not None
        assert not any(ord(ch) < 32 or 0x7F <= ord(ch) <= 0x9F for ch in message), repr(message)
        assert shown in message, message
        return message

    return run


def _redirect_with_escape(h):
    send(h, 302, headers=[("Location", "http://evil.example/\x1b]0;pwned\x07")])


CASES += [
    refused(
        CATEGORY,
        "the status line one byte every 0.25 s",
        "took longer than 2 s",
        on_time(_drip_bytes(HEADERS)),
    ),
    refused(
        CATEGORY,
        "headers one byte every 0.25 s after a prompt status line",
        "took longer than 2 s",
        on_time(lambda h: (h.wfile.write(b"HTTP/1.1 200 OK\r\n"), _drip_bytes(HEADERS[17:])(h))),
    ),
    refused(
        CATEGORY,
        "no answer at all (the connection held open)",
        "took longer than 2 s",
        on_time(lambda h: time.sleep(TIMEOUT + 3)),
    ),
    refused(
        CATEGORY,
        "X-Error-Code with a terminal escape (clear screen)",
        "\\x1b[2J",
        escaped(b"\x1b[2J\x1b[31mRepoNotFound", "\\x1b[2J"),
    ),
    refused(
        CATEGORY,
        "X-Error-Code with a CR that would rewrite the line (the header ends there)",
        "the hub answered HTTP 404 x",
        escaped(b"x\rservefleet: all hosts healthy", "HTTP 404 x"),
    ),
    refused(
        CATEGORY,
        "X-Error-Code with UTF-8 bidi bytes (U+202E)",
        "\\x80",
        escaped("a\u202eb".encode(), "\\x80"),
    ),
    refused(
        CATEGORY,
        "a redirect to another origin whose URL holds an OSC escape",
        "redirected to another origin (http://evil.example/%1B]0;pwned%07)",
        attempt(_redirect_with_escape),
    ),
]
