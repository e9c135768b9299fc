"""Hub requests: malformed and hostile HTTP requests to a real local hub (servefleet_dev.hub).

Each request goes as raw bytes over a socket (no client fixes it up) to one hub this module starts
on 127.0.0.1 with a free port, on first use, and stops at exit. A refusal is a 4xx answer, given as
"HTTP {status} {X-Error-Code, or the error text}"; a 2xx, a 5xx, no status line or no answer within
TIMEOUT_S counts as accepted. After every request the hub must still answer its health check.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from servefleet_dev.hub import HubHTTPServer, HubState, HubStore, make_server, publish
from tests.hostile.table import Case, harmless, refused

CATEGORY = "hub requests"
REPO = "acme/tiny"
CONFIG = b'{"hostile": "input"}\n'
RESOLVE = f"/{REPO}/resolve/main/config.json"
TIMEOUT_S = 5.0

_server: HubHTTPServer | None = None
_server_lock = threading.Lock()


def _stop(server: HubHTTPServer, thread: threading.Thread, root: Path) -> None:
    server.shutdown()
    server.server_close()
    thread.join(5)
    shutil.rmtree(root, ignore_errors=True)


def _address() -> tuple[str, int]:
    """The module's hub (started by the first case that needs one): a store holding REPO."""
    global _server
    with _server_lock:
        if _server is None:
            root = Path(tempfile.mkdtemp(prefix="servefleet-hostile-hub-"))
            (root / "src").mkdir()
            (root / "src" / "config.json").write_bytes(CONFIG)
            publish(root / "store", REPO, root / "src")
            server = make_server(HubState(HubStore(root / "store")), "127.0.0.1", 0)
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
            )
            thread.start()
            atexit.register(_stop, server, thread, root)
            _server = server
        host, port = _server.server_address[:2]
        return host, port


def _exchange(data: bytes) -> tuple[int | None, str, dict[str, str], bytes]:
    """Send data, keep the connection open (a server waiting for more must answer anyway), and read
    one response: (status or None, reason, lower-cased headers, body)."""
    raw = b""
    with socket.create_connection(_address(), timeout=TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
        except OSError:  # the server refused and closed before reading all of it: read its answer
            pass
        try:
            while b"\r\n\r\n" not in raw:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                raw += chunk
            head, _, body = raw.partition(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)
            }
            while len(body) < int(headers.get("content-length") or 0):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
        except (TimeoutError, ConnectionError):
            return None, "no answer", {}, b""
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/") or not code.isdigit():
        return None, f"no status line: {raw[:60]!r}", headers, body
    return int(code), reason, headers, body


def _still_serving() -> None:
    status, reason, _, _ = _exchange(b"GET /_servefleet/health HTTP/1.1\r\nHost: hub\r\n\r\n")
    assert status == 200, f"the hub stopped serving after the request: {status} {reason}"


def _one_line(status: int, reason: str, headers: dict[str, str], body: bytes) -> str:
    detail = headers.get("x-error-code")
    if not detail:
        try:
            detail = str(json.loads(body)["error"])
        except (ValueError, KeyError, TypeError):  # the stdlib's own HTML error page
            detail = reason
    return " ".join(f"HTTP {status} {detail}".split())


def _request(data: bytes) -> str | None:
    """The refusal a raw request got, one line; None when it was accepted or not answered."""
    status, reason, headers, body = _exchange(data)
    _still_serving()
    if status is None or not 400 <= status < 500:
        return None
    return _one_line(status, reason, headers, body)


def _get(target: str | bytes, *headers: str) -> bytes:
    target = target.encode("latin-1") if isinstance(target, str) else target
    return (
        b"GET "
        + target
        + b" HTTP/1.1\r\nHost: hub\r\n"
        + "".join(f"{h}\r\n" for h in headers).encode()
        + b"\r\n"
    )


def _post(target: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers) if headers else f"Content-Length: {len(body)}\r\n"
    return f"POST {target} HTTP/1.1\r\nHost: hub\r\n{head}\r\n".encode("latin-1") + body


def _refused(name: str, expected: str, data: bytes) -> Case:
    return refused(CATEGORY, name, expected, lambda: _request(data))


# -- harmless: answered, but nothing beyond what the request may have -------------------------------


def _whole_file_for(range_header: str) -> None:
    status, _, headers, body = _exchange(_get(RESOLVE, f"Range: {range_header}"))
    assert status in (200, 206), f"{status}: expected the whole file"
    assert body == CONFIG, f"body {body[:60]!r} is not the file"
    assert status == 200 or headers["content-range"] == f"bytes 0-{len(CONFIG) - 1}/{len(CONFIG)}"
    _still_serving()


def _no_injected_header() -> None:
    status, _, headers, _ = _exchange(_get(f"/{REPO}/resolve/main/a%0d%0aX-Injected:%201%0d%0a"))
    assert status == 404 and headers.get("x-error-code") == "EntryNotFound", status
    assert "x-injected" not in headers, "a header was injected through the path"
    assert "\r" not in headers.get("x-error-message", "") and "%0d" not in headers.get(
        "x-error-message", ""
    )
    _still_serving()


def _http2_gets_a_status_line() -> None:
    status, reason, _, _ = _exchange(b"GET / HTTP/2.0\r\n\r\n")
    assert status == 505, f"{status} {reason}: expected a 505 status line"
    _still_serving()


def _reset_mid_request_leaves_no_traceback() -> None:
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):  # the hub's threads print to sys.stderr
        for partial in (
            b"GET / HTTP/1.1\r\nHost: hub\r\nX-Half: ",
            _post("/_servefleet/faults", b"{", "Content-Length: 99"),
        ):
            with socket.create_connection(_address(), timeout=TIMEOUT_S) as sock:
                sock.sendall(partial)
                time.sleep(0.2)  # the handler is reading the rest
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )  # close = RST
        time.sleep(0.3)
        _still_serving()
    assert "Traceback" not in captured.getvalue(), captured.getvalue()[-500:]
    sys.stderr.write(captured.getvalue())


CASES: list[Case] = [
    # Request bodies: framing the hub cannot trust is refused and the connection closed.
    _refused(
        "Content-Length not a number",
        "HTTP 400 bad Content-Length 'abc'",
        _post("/_servefleet/faults", b"{}", "Content-Length: abc"),
    ),
    _refused(
        "negative Content-Length, connection held open",
        "HTTP 400 bad Content-Length '-1'",
        _post("/_servefleet/faults", b"{}", "Content-Length: -1"),
    ),
    _refused(
        "signed Content-Length (int() would take it)",
        "HTTP 400 bad Content-Length '+2'",
        _post("/_servefleet/faults", b"{}", "Content-Length: +2"),
    ),
    _refused(
        "Content-Length of 5000 digits",
        "HTTP 413 request body too large",
        _post("/_servefleet/faults", b"{}", "Content-Length: " + "9" * 5000),
    ),
    _refused(
        "two different Content-Lengths",
        "HTTP 400 bad Content-Length '2, 3'",
        _post("/_servefleet/faults", b"{} ", "Content-Length: 2", "Content-Length: 3"),
    ),
    _refused(
        "chunked request body (smuggling)",
        "HTTP 411 a request body needs a Content-Length",
        _post("/_servefleet/faults", b"2\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding: chunked"),
    ),
    _refused(
        "Transfer-Encoding and Content-Length together",
        "HTTP 400 both Transfer-Encoding and Content-Length",
        _post("/_servefleet/faults", b"{}", "Content-Length: 2", "Transfer-Encoding: chunked"),
    ),
    _refused(
        "fault rule nested 60000 deep",
        "HTTP 400 bad fault rule",
        _post("/_servefleet/faults", b"[" * 60000),
    ),
    _refused(
        "fault rule with an infinite rate",
        "HTTP 400 bad fault rule: bytes_per_second",
        _post("/_servefleet/faults", b'{"bytes_per_second": Infinity}'),
    ),
    # Names: looked up in the manifest and validated, never joined onto the store's directories.
    _refused(
        "../ in a resolve path, encoded",
        "HTTP 404 EntryNotFound",
        _get(f"/{REPO}/resolve/main/..%2F..%2Frefs%2Fmain"),
    ),
    _refused(
        "../ in a resolve path, literal",
        "HTTP 404 EntryNotFound",
        _get(f"/{REPO}/resolve/main/../../../../etc/passwd"),
    ),
    _refused(
        "absolute path as the file",
        "HTTP 404 EntryNotFound",
        _get(f"/{REPO}/resolve/main/%2Fetc%2Fpasswd"),
    ),
    _refused(
        "non-UTF-8 bytes in the file path",
        "HTTP 404 EntryNotFound",
        _get(f"/{REPO}/resolve/main/".encode() + b"\xff\xfe%ff.json"),
    ),
    _refused("repo id with ..", "HTTP 404 RepoNotFound", _get("/acme/../resolve/main/config.json")),
    _refused(
        "repo id %2e%2e/%2e%2e",
        "HTTP 404 RepoNotFound",
        _get("/%2e%2e/%2e%2e/resolve/main/config.json"),
    ),
    _refused(
        "repo id with an encoded slash",
        "HTTP 404 RepoNotFound",
        _get("/acme%2F..%2F../tiny/resolve/main/config.json"),
    ),
    _refused(
        "revision climbing out of refs/",
        "HTTP 404 RevisionNotFound",
        _get(f"/{REPO}/resolve/..%2F..%2Fcommits/config.json"),
    ),
    _refused(
        "NUL byte in the revision",
        "HTTP 404 RevisionNotFound",
        _get(f"/{REPO}/resolve/ma%00in/config.json"),
    ),
    _refused(
        "tree API prefix with ..",
        "HTTP 404 EntryNotFound",
        _get(f"/api/models/{REPO}/tree/main/..%2F.."),
    ),
    # Byte ranges.
    _refused(
        "range starting past the end",
        "HTTP 416 range not satisfiable",
        _get(RESOLVE, "Range: bytes=1000-"),
    ),
    _refused(
        "range with a negative end", "HTTP 416 malformed range", _get(RESOLVE, "Range: bytes=0--1")
    ),
    _refused(
        "range start of 5000 digits",
        "HTTP 416 range not satisfiable",
        _get(RESOLVE, "Range: bytes=" + "9" * 5000 + "-"),
    ),
    _refused(
        "empty suffix range bytes=-0",
        "HTTP 416 range not satisfiable",
        _get(RESOLVE, "Range: bytes=-0"),
    ),
    _refused(
        "range with no numbers", "HTTP 416 malformed range", _get(RESOLVE, "Range: bytes=abc")
    ),
    harmless(
        CATEGORY,
        "multi-range request",
        "the whole file, byte for byte (multi-ranges are ignored)",
        lambda: _whole_file_for("bytes=0-0,2-3"),
    ),
    harmless(
        CATEGORY,
        "suffix range longer than the file",
        "206 with exactly the whole file",
        lambda: _whole_file_for("bytes=-" + "9" * 5000),
    ),
    # Methods and the request line.
    _refused(
        "unknown method",
        "HTTP 405 method 'FOO' not allowed",
        _get(RESOLVE).replace(b"GET", b"FOO", 1),
    ),
    _refused(
        "PUT to a file",
        "HTTP 405 method 'PUT' not allowed",
        f"PUT {RESOLVE} HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc".encode(),
    ),
    _refused("POST to the file API", "HTTP 405 method not allowed", _post(RESOLVE, b"{}")),
    _refused("malformed HTTP version", "HTTP 400 Bad request version", b"GET / HTTP/x.y\r\n\r\n"),
    _refused(
        "unbalanced [ in an absolute-form target",
        "HTTP 400 malformed request target",
        b"GET http://[::1/x HTTP/1.1\r\n\r\n",
    ),
    _refused("request line over 64 KiB", "HTTP 414", _get("/" + "a" * 70000)),
    _refused("header line over 64 KiB", "HTTP 431", _get("/", "X-Long: " + "a" * 70000)),
    _refused("200 headers", "HTTP 431", _get("/", *(f"X-{i}: 1" for i in range(200)))),
    harmless(
        CATEGORY,
        "HTTP/2.0 request line",
        "a 505 status line (not a bare body), the hub keeps serving",
        _http2_gets_a_status_line,
    ),
    harmless(
        CATEGORY,
        "CR LF encoded in the path",
        "no header injected; X-Error-Message is escaped",
        _no_injected_header,
    ),
    harmless(
        CATEGORY,
        "client resets mid-request",
        "no traceback on the hub's stderr, the hub keeps serving",
        _reset_mid_request_leaves_no_traceback,
    ),
]
