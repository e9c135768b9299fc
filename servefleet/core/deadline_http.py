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
import weakref
from typing import cast


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
        got = self._raw.readinto(buffer)
        return 0 if got is None else got

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


def _connect(conn: http.client.HTTPConnection, deadline: float, connect) -> None:
    """Connect within the time left, then read the answer through the deadline's socket."""
    conn.timeout = min(conn.timeout or _left(deadline), _left(deadline))
    connect()
    conn.sock = cast(socket.socket, _DeadlineSocket(conn.sock, deadline))


class _HTTP(http.client.HTTPConnection):
    deadline = 0.0

    def connect(self) -> None:
        _connect(self, self.deadline, super().connect)


class _HTTPS(http.client.HTTPSConnection):
    deadline = 0.0

    def connect(self) -> None:
        _connect(self, self.deadline, super().connect)


def _connection(cls, deadline: float):
    def make(*args, **kwargs):
        conn = cls(*args, **kwargs)
        conn.deadline = deadline
        return conn

    return make


_DEADLINES: weakref.WeakKeyDictionary[urllib.request.Request, float] = weakref.WeakKeyDictionary()


def set_deadline(req: urllib.request.Request, deadline: float) -> float:
    """Give the request its deadline (time.monotonic); returns it."""
    _DEADLINES[req] = deadline
    return deadline


def deadline_of(req: urllib.request.Request) -> float:
    """The request's deadline, as set_deadline() gave it (else its timeout from now)."""
    found = _DEADLINES.get(req)
    return found if found is not None else time.monotonic() + (getattr(req, "timeout", 0) or 30)


class HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_connection(_HTTP, deadline_of(req)), req)


class HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        kwargs = {"context": getattr(self, "_context", None)}
        if getattr(self, "_check_hostname", None) is not None:  # Python 3.11's
            kwargs["check_hostname"] = getattr(self, "_check_hostname", None)
        return self.do_open(_connection(_HTTPS, deadline_of(req)), req, **kwargs)
