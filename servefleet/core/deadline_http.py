"""urllib with one deadline per request, headers included: the operator-side hub client's.

urllib's `timeout` bounds each socket operation, so a server sending one header byte a second
holds a request as long as it likes. Here every read of the answer (status line, headers,
body) first sets the socket's timeout to the time left before the request's deadline; past it,
the read fails with TimeoutError. Connecting waits at most the time left.
"""

from __future__ import annotations

import http.client
import io
import socket
import time
import urllib.request


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side (its own unbuffered makefile, which keeps the socket open while
    the answer is read) that never waits past `deadline` (time.monotonic)."""

    def __init__(self, sock: socket.socket, deadline: float):
        super().__init__()
        self._sock, self._raw, self._deadline = sock, sock.makefile("rb", buffering=0), deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than the request's deadline")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """The connection's socket, whose makefile() reads through _DeadlineReader."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode="r", *args, **kwargs):
        if "r" in mode:
            return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))
        return self._sock.makefile(mode, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed before it was sent")
    return left


def _bounded(base):
    class Connection(base):
        deadline = 0.0

        def connect(self):
            self.timeout = min(self.timeout, _left(self.deadline))
            super().connect()
            self.sock = _DeadlineSocket(self.sock, self.deadline)

    return Connection


_HTTP = _bounded(http.client.HTTPConnection)
_HTTPS = _bounded(http.client.HTTPSConnection)


def _connection(cls, deadline: float):
    def make(*args, **kwargs):
        conn = cls(*args, **kwargs)
        conn.deadline = deadline
        return conn

    return make


def deadline_of(req: urllib.request.Request) -> float:
    """The request's deadline (time.monotonic), set by the caller as `req.deadline`."""
    return getattr(req, "deadline", None) or time.monotonic() + (req.timeout or 30)


class HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_connection(_HTTP, deadline_of(req)), req)


class HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        kwargs = {"context": self._context}
        if getattr(self, "_check_hostname", None) is not None:  # Python 3.11's
            kwargs["check_hostname"] = self._check_hostname
        return self.do_open(_connection(_HTTPS, deadline_of(req)), req, **kwargs)
