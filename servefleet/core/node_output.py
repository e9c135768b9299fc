"""Node output is bytes: what a fact prints that a node's user may name (file names, file
contents) travels base64-encoded, so that every line pyinfra reads is ASCII.

pyinfra decodes every line of a command's output as strict UTF-8 before a fact sees it. A file
name that is not UTF-8 ends its reader with a UnicodeDecodeError, so the rest of the answer is
lost and every fact after it takes its default. A name holding a newline forges a line of a
listing. Encoded on the node (coreutils' `base64`, NUL between names) and decoded here, a name
reaches the operator whole, whatever bytes it holds; `shown` writes it on one line."""

from __future__ import annotations

import base64
import binascii
import re

# Piped after a command: its bytes as one base64 line (coreutils; -w 0: no wrapping).
ENCODE = "base64 -w 0; echo"
MAX_LISTING = 8 * 1024 * 1024  # bytes of NUL-separated names a listing may hold


class NodeOutputError(ValueError):
    """An answer that is not what its command prints: cut short or not base64."""


def decode(lines: list[str], what: str) -> bytes:
    """The bytes of an ENCODE'd answer (its lines joined)."""
    text = "".join(line.strip() for line in lines)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise NodeOutputError(
            f"{what}: the node's answer is not the base64 it sends (cut short?)"
        ) from None


def as_name(raw: bytes) -> str:
    """A file name as a str that keeps every byte (undecodable ones as surrogates)."""
    return raw.decode("utf-8", "surrogateescape")


# What never reaches the operator's terminal as it is: C0 and C1 controls (ESC starts a terminal
# escape), DEL, line and paragraph separators, bidi controls, lone surrogates (bytes not UTF-8).
_UNPRINTABLE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    r"\ud800-\udfff]"
)


def shown(name: str) -> str:
    """Remote text (a node's name or output, a hub's or an engine's words) for one line of a
    message on the operator's terminal: bytes that are not UTF-8, control characters, line
    separators and bidi controls written as escapes (\\xNN, \\n, \\x1b, \\u2028, \\u202e).
    The one place such text is made printable."""

    def esc(m):
        ch = m.group(0)
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's byte
            return f"\\x{code - 0xDC00:02x}"
        return ch.encode("unicode_escape").decode("ascii")

    return _UNPRINTABLE.sub(esc, name)


def sized_names(raw: bytes) -> dict[str, int]:
    """{name: size} from `find -printf '%s %P\\0'` output."""
    out = {}
    for entry in raw.split(b"\0"):
        size, _, name = entry.partition(b" ")
        if size.isdigit() and name:
            out[as_name(name)] = int(size)
    return out


def names(raw: bytes) -> list[str]:
    """Names from `find -printf '%P\\0'` output."""
    return [as_name(n) for n in raw.split(b"\0") if n]
