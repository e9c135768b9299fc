"""The one reader of an engine's answers on a node: the health check (bin/servefleet-health) and
the bench (bin/servefleet-stream-bench, also the performance gate's) read every answer of the
serving engine through this module. Standard library only; uploaded beside them as
bin/engine_client.py and loaded from there by file name (they run with python -I).

Every exchange has ONE deadline for all of it: connect, sending, the status line, the headers,
the body or the stream. The socket's timeout is set to what is left before every recv, so an
engine that drips one byte a second ends at the deadline like one that never answers. An
answer is bounded in bytes (status line, 100 header lines of at most 8 KiB, the body or the
stream, each stream line), its JSON in depth, and values are checked against the types the
caller expects: a bool is not a number, numbers are finite and within their range, an object
has the keys it must have. Redirects are never followed (the bearer key goes to the URL it was
given, nowhere else); only http:// URLs are spoken. Every failure is an EngineError whose text
is one line.
"""

import json
import math
import socket
import time
import urllib.parse

MAX_HEADER_LINES = 100
MAX_HEADER_LINE = 8192
MAX_BODY = 1 << 20  # a JSON answer (health, tokenize, one chat) is a few KiB
MAX_LINE = 1 << 20  # one line of an event stream
MAX_DEPTH = 64
MAX_INT_DIGITS = 30
ERROR_SNIPPET = 200  # bytes of an error answer quoted in the message


class EngineError(Exception):
    """What went wrong with an engine's answer, in one line."""

    def __init__(self, message):
        super().__init__(one_line(message))


def one_line(text, limit=400):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value, limit=60):
    """A value of an answer as a message may quote it: repr, one line, short."""
    return one_line(repr(value), limit)


class Deadline:
    """An absolute deadline, `seconds` from now (time.monotonic)."""

    def __init__(self, seconds, now=time.monotonic):
        self.seconds, self.now = seconds, now
        self.at = now() + max(0.0, float(seconds))

    def left(self):
        return self.at - self.now()

    def sooner(self, seconds):
        """A deadline `seconds` from now, or this one when it comes first."""
        inner = Deadline(seconds, self.now)
        if inner.at > self.at:
            inner.at, inner.seconds = self.at, self.seconds
        return inner

    def passed(self):
        return self.left() <= 0

    def expired(self, what):
        return EngineError(f"{what}: no complete answer within {self.seconds:g} s")


def split_url(url):
    """(host, port, base path) of an http:// URL; EngineError for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or 80
    except ValueError as exc:
        raise EngineError(f"the URL {shown(url)} is not valid: {exc}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise EngineError(f"the URL {shown(url)} is not an http:// URL with a host")
    return parts.hostname, port, parts.path.rstrip("/")


class _Stream:
    """Bytes from a socket, each recv within the deadline."""

    def __init__(self, sock, deadline, what):
        self.sock, self.deadline, self.what = sock, deadline, what
        self.buf = b""
        self.closed = False

    def fill(self):
        """More bytes into buf; False at the end of the connection."""
        if self.closed:
            return False
        left = self.deadline.left()
        if left <= 0:
            raise self.deadline.expired(self.what)
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise self.deadline.expired(self.what) from None
        except OSError as exc:
            raise EngineError(f"{self.what}: {exc.strerror or exc}") from None
        if not data:
            self.closed = True
            return False
        self.buf += data
        return True

    def line(self, limit, name):
        """One line (without its end), at most `limit` bytes; None at the end of the stream."""
        start = 0
        while True:
            at = self.buf.find(b"\n", start)
            if at >= 0:
                if at > limit:
                    break
                line, self.buf = self.buf[:at], self.buf[at + 1 :]
                return line[:-1] if line.endswith(b"\r") else line
            if len(self.buf) > limit:
                break
            start = len(self.buf)
            if not self.fill():
                if not self.buf:
                    return None
                line, self.buf = self.buf, b""
                return line
        raise EngineError(f"{self.what}: {name} longer than {limit} bytes")

    def exactly(self, count):
        while len(self.buf) < count:
            if not self.fill():
                raise EngineError(f"{self.what}: the connection closed in the middle of the answer")
        data, self.buf = self.buf[:count], self.buf[count:]
        return data

    def some(self):
        """What is buffered or the next recv; b"" at the end."""
        if not self.buf and not self.fill():
            return b""
        data, self.buf = self.buf, b""
        return data


class Answer:
    """An engine's answer: status, headers (lower-case names), and its body read on demand,
    within the request's deadline and at most max_bytes in all."""

    def __init__(self, stream, status, reason, headers, method, max_bytes):
        self._stream, self.status, self.reason, self.headers = stream, status, reason, headers
        self.what, self.max_bytes, self._read = stream.what, max_bytes, 0
        self._pieces = self._body(method)

    def close(self):
        try:
            self._stream.sock.close()
        except OSError:
            pass

    def _count(self, size):
        self._read += size
        if self._read > self.max_bytes:
            raise EngineError(f"{self.what}: the answer is larger than {self.max_bytes} bytes")

    def _body(self, method):
        s = self._stream
        if method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            return
        coding = self.headers.get("transfer-encoding", "").lower()
        if coding:
            if coding != "chunked":
                raise EngineError(f"{self.what}: transfer encoding {shown(coding)} is not spoken")
            while True:
                size_line = s.line(1024, "a chunk size line")
                if size_line is None:
                    raise EngineError(
                        f"{self.what}: the connection closed in the middle of the answer"
                    )
                digits = size_line.split(b";", 1)[0].strip()
                if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
                    raise EngineError(f"{self.what}: a malformed chunk size {shown(size_line)}")
                size = int(digits, 16)
                if size == 0:
                    for _ in range(MAX_HEADER_LINES + 1):
                        trailer = s.line(MAX_HEADER_LINE, "a trailer line")
                        if not trailer:
                            return
                    raise EngineError(f"{self.what}: more than {MAX_HEADER_LINES} trailer lines")
                self._count(size)
                while size:
                    piece = s.exactly(min(size, 65536))
                    size -= len(piece)
                    yield piece
                if s.exactly(2) != b"\r\n":
                    raise EngineError(f"{self.what}: a chunk does not end with CRLF")
        length = self.headers.get("content-length")
        if length is not None:
            if not length.isdigit() or len(length) > 18:
                raise EngineError(f"{self.what}: Content-Length {shown(length)} is not a length")
            left = int(length)
            self._count(left)
            while left:
                piece = s.exactly(min(left, 65536))
                left -= len(piece)
                yield piece
            return
        while True:  # until the connection closes
            piece = s.some()
            if not piece:
                return
            self._count(len(piece))
            yield piece

    def body(self):
        """All of the body (at most max_bytes)."""
        return b"".join(self._pieces)

    def lines(self, limit=MAX_LINE):
        """The body's lines, each at most `limit` bytes (an event stream)."""
        buf = b""
        for piece in self._pieces:
            buf += piece
            while True:
                at = buf.find(b"\n")
                if at < 0:
                    break
                if at > limit:
                    raise EngineError(f"{self.what}: a line longer than {limit} bytes")
                line, buf = buf[:at], buf[at + 1 :]
                yield line[:-1] if line.endswith(b"\r") else line
            if len(buf) > limit:
                raise EngineError(f"{self.what}: a line longer than {limit} bytes")
        if buf:
            yield buf

    def json(self, depth=MAX_DEPTH):
        return loads(self.body(), self.what, depth)

    def expect(self, status=200):
        """self when the status is `status`; else EngineError naming it (a redirect is never
        followed) and the start of the body."""
        if self.status == status:
            return self
        text = f"{self.what}: HTTP {self.status}"
        if 300 <= self.status < 400:
            text += f" (a redirect to {shown(self.headers.get('location', ''), 80)}, not followed)"
        else:
            try:
                self.max_bytes = min(self.max_bytes, 64 << 10)
                snippet = b""
                for piece in self._pieces:
                    snippet += piece
                    if len(snippet) >= ERROR_SNIPPET:
                        break
                text += f" {shown(snippet[:ERROR_SNIPPET].decode('utf-8', 'replace'), 120)}"
            except EngineError:
                pass
        raise EngineError(text)


def request(url, method, path, deadline, body=None, headers=None, what=None, max_bytes=MAX_BODY):
    """Send one request to the engine at `url` and read its status line and headers, all within
    `deadline` (a Deadline); the body is read from the Answer within the same deadline. `body`:
    a JSON document (sent as application/json). The caller closes the answer."""
    what = what or f"{method} {path}"
    host, port, base = split_url(url)
    if deadline.passed():
        raise deadline.expired(what)
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [
        f"{method} {base}{path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Connection: close",
        "Accept: */*",
        "User-Agent: servefleet",
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    for name, value in (headers or {}).items():
        if any(c in str(value) for c in "\r\n") or any(c in name for c in "\r\n:"):
            raise EngineError(f"{what}: a header with a line break")
        lines.append(f"{name}: {value}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
    try:
        sock = socket.create_connection((host, port), timeout=max(deadline.left(), 0.001))
    except TimeoutError:
        raise deadline.expired(what) from None
    except OSError as exc:
        raise EngineError(
            f"{what}: cannot connect to {host}:{port}: {exc.strerror or exc}"
        ) from None
    try:
        left = deadline.left()
        if left <= 0:
            raise deadline.expired(what)
        sock.settimeout(left)
        try:
            sock.sendall(raw)
        except TimeoutError:
            raise deadline.expired(what) from None
        except OSError as exc:
            raise EngineError(f"{what}: sending the request: {exc.strerror or exc}") from None
        stream = _Stream(sock, deadline, what)
        status, reason = _status(stream, what)
        while 100 <= status < 200:  # 100 Continue and friends: their headers, then the answer
            _headers(stream, what)
            status, reason = _status(stream, what)
        answer = Answer(stream, status, reason, _headers(stream, what), method, max_bytes)
    except BaseException:
        sock.close()
        raise
    return answer


def _status(stream, what):
    line = stream.line(MAX_HEADER_LINE, "the status line")
    if line is None:
        raise EngineError(f"{what}: the connection closed before an answer")
    parts = line.split(b" ", 2)
    if (
        len(parts) < 2
        or parts[0] not in (b"HTTP/1.0", b"HTTP/1.1")
        or len(parts[1]) != 3
        or not parts[1].isdigit()
    ):
        raise EngineError(f"{what}: not an HTTP answer: {shown(line[:80])}")
    return int(parts[1]), (parts[2] if len(parts) > 2 else b"").decode("latin-1")


def _headers(stream, what):
    headers = {}
    for _ in range(MAX_HEADER_LINES + 1):
        line = stream.line(MAX_HEADER_LINE, "a header line")
        if line is None:
            raise EngineError(f"{what}: the connection closed in the headers")
        if not line:
            return headers
        name, sep, value = line.partition(b":")
        name = name.decode("latin-1").strip().lower()
        if not sep or not name or name != name.split()[0]:
            raise EngineError(f"{what}: a malformed header line {shown(line[:80])}")
        value = value.decode("latin-1").strip()
        if (
            name in ("content-length", "transfer-encoding")
            and name in headers
            and headers[name] != value
        ):
            raise EngineError(f"{what}: two different {name} headers")
        headers[name] = value
    raise EngineError(f"{what}: more than {MAX_HEADER_LINES} header lines")


# --- JSON, strictly --------------------------------------------------------------------------


def _constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _int(text):
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def check_depth(data, depth=MAX_DEPTH):
    """ValueError when `data` (JSON bytes) nests deeper than `depth` (checked before parsing:
    deep nesting would end the parser in a RecursionError)."""
    level = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            level += 1
            if level > depth:
                raise ValueError(f"it nests deeper than {depth} levels")
        elif byte in (0x5D, 0x7D):
            level -= 1


def loads(data, what, depth=MAX_DEPTH):
    """A JSON document from bytes: UTF-8, at most `depth` levels, no NaN or Infinity, every
    number finite, integers of at most 30 digits; EngineError otherwise."""
    try:
        check_depth(data, depth)
        text = data.decode("utf-8")
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except UnicodeDecodeError:
        raise EngineError(f"{what}: the answer is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise EngineError(f"{what}: the answer is not valid JSON: {exc}") from None


# --- types, strictly -------------------------------------------------------------------------


def kind(value):
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def obj(value, what):
    if not isinstance(value, dict):
        raise EngineError(f"{what}: expected an object, got {kind(value)}")
    return value


def items(value, what):
    if not isinstance(value, list):
        raise EngineError(f"{what}: expected a list, got {kind(value)}")
    return value


def text(value, what, optional=False):
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise EngineError(f"{what}: expected a string, got {kind(value)}")
    return value


def count(value, what, low=0, high=None):
    """An integer within [low, high]: not a bool, not a float."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineError(f"{what}: expected an integer, got {kind(value)} {shown(value, 40)}")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise EngineError(f"{what}: {value} is out of range ({bound})")
    return value


def number(value, what, low=None, high=None):
    """A finite number within [low, high]: not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineError(f"{what}: expected a number, got {kind(value)} {shown(value, 40)}")
    if (
        not math.isfinite(value)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        raise EngineError(f"{what}: {shown(value, 40)} is out of range")
    return value


def field(doc, key, what):
    """doc[key] of an object that must have it."""
    obj(doc, what)
    if key not in doc:
        raise EngineError(f"{what}: no {key!r} in the answer")
    return doc[key]
