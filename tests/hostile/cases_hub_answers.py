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
