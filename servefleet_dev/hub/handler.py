"""The hub's request handler: file downloads, the /api/ documents, the /_servefleet/ endpoints.

Hostile or malformed requests get one 4xx answer, never a 500, a traceback or a hang: a bad or
negative Content-Length or a chunked body (400/411, and the connection closes: its framing is
unknown), a body over 64 KiB (413), a malformed or unsatisfiable byte range (416), a method the hub
does not serve (405), names that are no repo, revision or file of the store (404: paths are looked
up in the commit's manifest, never joined onto the file system).
"""

from __future__ import annotations

import hmac
import json
import os
import re
import select
import socket
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from servefleet_dev.hub.api import repo_info, tree
from servefleet_dev.hub.state import FaultRule
from servefleet_dev.hub.store import Commit, RepoNotFound, RevisionNotFound

METHODS = ("GET", "HEAD", "POST", "DELETE")
_MAX_BODY = 1 << 16  # the operator endpoints take small JSON documents; the file API takes none
_SEND_CHUNK = 8 * 1024 * 1024
_MAX_MESSAGE = 300  # error messages echo the request: keep hostile ones short
_DIGITS_RE = re.compile(r"[0-9]+")  # not str.isdigit()/int(): those take "+1", "1_0", "²", " 1"
_RANGE_RE = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)")


class _HTTPError(Exception):
    """An answer other than 2xx; close=True when the request's body framing cannot be trusted."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict | None = None,
        close: bool = False,
    ):
        super().__init__(message)
        self.status, self.code, self.headers, self.close = status, code, headers or {}, close


def _count(digits: str) -> int:
    """A run of ASCII digits as an int; beyond 18 digits (no file is that big) a huge stand-in."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 1 << 62


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single `bytes=` range; None = the whole file.

    Other units and multi-ranges are ignored (RFC 9110 14.2: a server may send the whole file); a
    `bytes=` range that is malformed or that no byte of the file satisfies is refused with 416.
    """
    if not header:
        return None
    unit, sep, spec = header.partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in spec:
        return None
    unsatisfiable = {"Content-Range": f"bytes */{size}"}
    match = _RANGE_RE.fullmatch(spec.strip())
    if match is None:
        raise _HTTPError(416, f"malformed range {header[:80]!r}", headers=unsatisfiable)
    first, last, suffix = match.groups()
    if suffix is not None:  # the last N bytes ("-0": none of them, unsatisfiable)
        n = _count(suffix)
        start, end = (max(0, size - n) if n else size), size - 1
    else:
        start, end = _count(first), (_count(last) if last else size - 1)
    if start >= size or start > end:
        raise _HTTPError(416, "range not satisfiable", headers=unsatisfiable)
    return start, min(end, size - 1)


def _content_length(values: list[str]) -> int:
    """The request body's length from its Content-Length header(s); 0 without one."""
    values = [v.strip() for v in values]
    if not values:
        return 0
    if len(set(values)) != 1 or not _DIGITS_RE.fullmatch(values[0]):
        raise _HTTPError(400, f"bad Content-Length {', '.join(values)[:40]!r}", close=True)
    length = _count(values[0])
    if length > _MAX_BODY:
        raise _HTTPError(413, "request body too large", close=True)
    return length


class HubRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools connections
    # The version errors are answered in: with the stdlib's default (HTTP/0.9), a bad or HTTP/2.0
    # request line got a bare HTML body with no status line.
    default_request_version = "HTTP/1.0"
    server_version = "servefleet-hub/1"
    timeout = 120  # idle keep-alive connections give their thread back after this
    # self.server is server.HubHTTPServer (not imported: that module imports this one); .hub is its HubState

    # -- plumbing ----------------------------------------------------------------------------------

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        if self.server.hub.verbose:
            super().log_message(format, *args)

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def __getattr__(self, name: str):
        # BaseHTTPRequestHandler answers a method without a do_X with 501; the hub knows no other
        # method and refuses them (405) after reading their body, like a wrong method on a route.
        if name.startswith("do_"):
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    def _dispatch(self, method: str) -> None:
        self._headers_sent = False
        hub = self.server.hub
        try:
            body = self._read_body()
            if method not in METHODS:
                raise _HTTPError(
                    405,
                    f"method {method[:20]!r} not allowed",
                    headers={"Allow": ", ".join(METHODS)},
                )
            try:
                url = urlsplit(self.path)
            except ValueError:  # e.g. an unbalanced "[" in an absolute-form target
                raise _HTTPError(400, "malformed request target") from None
            segs = url.path.split("/")[1:]  # still quoted: a quoted rev may contain %2F
            if segs[:1] == ["_servefleet"]:
                return self._control(method, segs[1:], body)
            self._check_token()
            if segs[:1] == ["api"]:
                if method != "GET":
                    raise _HTTPError(405, "method not allowed", headers={"Allow": "GET"})
                return self._api(segs[1:], parse_qs(url.query))
            if method not in ("GET", "HEAD"):
                raise _HTTPError(405, "method not allowed", headers={"Allow": "GET, HEAD"})
            return self._resolve(method, segs)
        except _HTTPError as exc:
            hub.stats.count_request("errors")
            if exc.close:
                self.close_connection = True
                exc.headers = exc.headers | {"Connection": "close"}
            message = str(exc) if len(str(exc)) <= _MAX_MESSAGE else str(exc)[:_MAX_MESSAGE] + "..."
            self._send_json(exc.status, {"error": message}, method, exc.code, exc.headers)
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away; nothing to answer
        except Exception:  # a bug or a broken store: say so, and keep serving other requests
            self.close_connection = True
            print(f"servefleet hub: internal error on {method} {self.path[:200]}", file=sys.stderr)
            traceback.print_exc()
            if not self._headers_sent:
                self._send_json(500, {"error": "internal server error"}, method)

    def end_headers(self):
        self._headers_sent = True
        super().end_headers()

    def _read_body(self) -> bytes:
        if "Transfer-Encoding" in self.headers:  # chunked bodies are not read: refuse, then close
            if "Content-Length" in self.headers:
                raise _HTTPError(400, "both Transfer-Encoding and Content-Length", close=True)
            raise _HTTPError(411, "a request body needs a Content-Length", close=True)
        length = _content_length(self.headers.get_all("Content-Length") or [])
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            raise ConnectionResetError("the client closed before sending its body")
        return body

    def _check_token(self) -> None:
        token = self.server.hub.token
        if token is None:
            return
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            # What the hub answers for a private repo without credentials: the client raises
            # RepositoryNotFoundError.
            raise _HTTPError(401, "Invalid username or password.", "RepoNotFound")

    def _send_json(self, status, doc, method="GET", code=None, headers=None, count=True) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code:
            self.send_header("X-Error-Code", code)
            # json-escaped: a path from the URL may hold non-latin-1 characters or a newline.
            self.send_header("X-Error-Message", json.dumps(str(doc.get("error", "")))[1:-1])
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)
            if count:
                self.server.hub.stats.add_api_bytes(len(data))

    # -- hub endpoints ---------------------------------------------------------------------------

    @staticmethod
    def _repo_type(segs: list[str]) -> tuple[str, list[str]]:
        if segs and segs[0] == "datasets":
            return "dataset", segs[1:]
        return "model", segs

    def _lookup(self, repo_type: str, repo_id: str, rev: str) -> Commit:
        try:
            return self.server.hub.store.resolve(repo_type, repo_id, rev)
        except RepoNotFound as exc:
            raise _HTTPError(404, str(exc), "RepoNotFound") from None
        except RevisionNotFound as exc:
            raise _HTTPError(404, str(exc), "RevisionNotFound") from None

    def _resolve(self, method: str, segs: list[str]) -> None:
        repo_type, segs = self._repo_type(segs)
        if len(segs) < 5 or segs[2] != "resolve" or not segs[4]:
            raise _HTTPError(404, "not found")
        repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
        commit = self._lookup(repo_type, repo_id, unquote(segs[3]))
        # Looked up in the manifest, never joined onto a directory: "../x" is just an absent entry.
        path = unquote("/".join(segs[4:]))
        entry = commit.files.get(path)
        if entry is None:
            raise _HTTPError(
                404,
                f"{path!r} not found at {commit.sha}",
                "EntryNotFound",
                {"X-Repo-Commit": commit.sha},
            )
        hub = self.server.hub
        blob = hub.store.blob(repo_type, repo_id, entry)
        rng = _parse_range(self.headers.get("Range"), entry.size)
        start, end = rng or (0, entry.size - 1)
        repo_key = repo_id if repo_type == "model" else f"datasets/{repo_id}"
        file_key = f"{repo_key}/{path}"
        if method == "HEAD":
            hub.stats.count_request("resolve_head")
        else:
            hub.stats.count_request("resolve_get", file_key, ranged=rng is not None)

        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{entry.etag}"')
        self.send_header("X-Repo-Commit", commit.sha)
        if entry.lfs_sha256:  # the hub's headers for LFS files (it redirects them to a CDN)
            self.send_header("X-Linked-Etag", f'"{entry.lfs_sha256}"')
            self.send_header("X-Linked-Size", str(entry.size))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{entry.size}")
        self.end_headers()
        if method == "GET" and end >= start:
            self._send_file(
                blob, start, end - start + 1, repo_key, file_key, hub.faults.begin(file_key)
            )

    def _send_file(
        self, blob: Path, offset: int, length: int, repo_key: str, file_key: str, rule
    ) -> None:
        """sendfile() the byte range in bounded chunks, counting each, honouring fault rules."""
        stats = self.server.hub.stats
        sock = self.connection
        sent = 0
        with open(blob, "rb") as f:
            while sent < length:
                chunk = min(length - sent, _SEND_CHUNK)
                rate = rule.bytes_per_second if rule is not None and rule.active else None
                if rate:
                    chunk = min(
                        chunk, max(1, rate // 10)
                    )  # ~10 sends a second keeps the rate smooth
                if rule is not None and rule.drop_after is not None:
                    chunk = min(chunk, rule.drop_after - sent)
                    if chunk <= 0:
                        self.close_connection = (
                            True  # body cut short: the client sees a broken transfer
                        )
                        return
                began = time.monotonic()
                n = _sendfile(sock, f.fileno(), offset + sent, chunk)
                if n == 0:  # blob shorter than its manifest says: cut, don't hang the client
                    self.close_connection = True
                    return
                sent += n
                stats.add_bytes(repo_key, file_key, n)
                if rate:
                    time.sleep(max(0.0, n / rate - (time.monotonic() - began)))

    def _api(self, segs: list[str], query: dict) -> None:
        # /api/{models|datasets}/{org}/{name}[/revision/{rev} | /tree/{rev}[/{dir}] | /refs]
        if len(segs) < 3 or segs[0] not in ("models", "datasets"):
            raise _HTTPError(404, "not found")
        repo_type = segs[0][:-1]
        repo_id = f"{unquote(segs[1])}/{unquote(segs[2])}"
        rest = segs[3:]
        hub = self.server.hub
        hub.stats.count_request("api")
        if not rest or (rest[0] == "revision" and len(rest) == 2):
            commit = self._lookup(repo_type, repo_id, unquote(rest[1]) if rest else "main")
            return self._send_json(200, repo_info(repo_id, commit))
        if rest[0] == "tree" and len(rest) >= 2:
            commit = self._lookup(repo_type, repo_id, unquote(rest[1]))
            prefix = unquote("/".join(rest[2:])).strip("/")
            flag = lambda name: query.get(name, ["false"])[0].lower() in ("1", "true")  # noqa: E731
            entries = tree(commit, prefix, flag("recursive"), flag("expand"))
            if entries is None:
                raise _HTTPError(
                    404, f"{prefix!r} not found", "EntryNotFound", {"X-Repo-Commit": commit.sha}
                )
            return self._send_json(200, entries)
        if rest == ["refs"]:
            try:
                branches = hub.store.branches(repo_type, repo_id)
            except RepoNotFound as exc:
                raise _HTTPError(404, str(exc), "RepoNotFound") from None
            refs = [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": s}
                for b, s in branches.items()
            ]
            return self._send_json(
                200, {"branches": refs, "converts": [], "tags": [], "pullRequests": []}
            )
        raise _HTTPError(404, "not found")

    # -- operator endpoints ------------------------------------------------------------------------

    def _control(self, method: str, segs: list[str], body: bytes) -> None:
        hub = self.server.hub
        route = (method, "/".join(segs))
        if route == ("GET", "health"):
            return self._send_json(200, {"ok": True, "root": str(hub.store.root)}, count=False)
        if route == ("GET", "stats"):
            return self._send_json(200, hub.stats.snapshot(), count=False)
        if route == ("POST", "stats/reset"):
            hub.stats.reset()
            return self._send_json(200, hub.stats.snapshot(), count=False)
        if route == ("GET", "faults"):
            return self._send_json(200, hub.faults.to_json(), count=False)
        if route == ("DELETE", "faults"):
            hub.faults.clear()
            return self._send_json(200, [], count=False)
        if route == ("POST", "faults"):
            try:
                rule = FaultRule.from_json(json.loads(body or b"{}"))
            except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested too deep
                raise _HTTPError(400, f"bad fault rule: {exc}") from None
            hub.faults.set(rule)
            return self._send_json(200, hub.faults.to_json(), count=False)
        raise _HTTPError(404, "not found")


def _sendfile(sock: socket.socket, fd: int, offset: int, count: int) -> int:
    """One os.sendfile on a socket that has a timeout (so is non-blocking underneath)."""
    while True:
        try:
            return os.sendfile(sock.fileno(), fd, offset, count)
        except BlockingIOError:
            timeout = sock.gettimeout()
            _, writable, _ = select.select([], [sock], [], timeout)
            if not writable:
                raise TimeoutError("client stopped reading") from None
