"""Records root keeps on a node (state/releases.json, running.json, rollout.json, llama.cpp's
build records), parsed strictly: a record is at most MAX_BYTES, nested at most MAX_DEPTH deep,
plain JSON (no NaN, no Infinity, no key twice), and each field has the type and form its
reader expects. Anything else is a RecordError: one line naming the record and what is wrong,
which the reader turns into a failed host or a drift item, never a default that looks empty
(an empty releases.json would be rewritten with the new release alone).

Only root can write these files, so they are parsed as a careful reader, not as a wall."""

from __future__ import annotations

import json
import math
import posixpath
import re
import shlex
from typing import Literal, overload

from servefleet.core.node_output import ENCODE, NodeOutputError, decode

MAX_BYTES = 4 * 1024 * 1024  # a releases.json with 16 releases and their units is ~200 KiB
MAX_DEPTH = 16  # the deepest record (a release's perf figures) is 4 levels

# What a fact prints instead of a file that is there but not a regular file (a FIFO would block
# `cat`, a link to /dev/zero would stream forever): the reader's one line names it.
NOT_REGULAR = "##servefleet-not-a-regular-file##"


class RecordError(ValueError):
    """A record that cannot be read as its reader expects; the message is one line."""


class Unreadable(str):
    """A fact's answer for a record that is there but cannot be read: the one-line reason.
    Never equal to a release id, never a marker; readers check for it by type."""


def read_command(path: str) -> str:
    """Shell: the file's bytes, at most MAX_BYTES + 1 of them, only when it is a regular file
    and no link; nothing when it does not exist; NOT_REGULAR otherwise."""
    p = shlex.quote(path)
    return (
        f"if [ -f {p} ] && [ ! -L {p} ]; then head -c {MAX_BYTES + 1} {p} | {ENCODE}; "
        f"elif [ -e {p} ] || [ -L {p} ]; then echo '{NOT_REGULAR}'; fi"
    )


def from_node(lines: list[str], what: str) -> str:
    """The text of a record read by read_command (its bytes came base64-encoded, so that no
    byte of it can cut pyinfra's reader short); RecordError when it is not UTF-8 text."""
    if [ln.strip() for ln in lines if ln.strip()] == [NOT_REGULAR]:
        raise RecordError(f"{what} is not a regular file (a FIFO, a device or a link)")
    try:
        raw = decode(lines, what)
        if len(raw) > MAX_BYTES:
            raise RecordError(f"{what} is larger than {MAX_BYTES} bytes")
        return raw.decode("utf-8")
    except NodeOutputError as exc:
        raise RecordError(str(exc)) from None
    except UnicodeDecodeError:
        raise RecordError(f"{what} is not UTF-8 text") from None


def _depth_ok(text: str) -> bool:
    """Nesting of [ and { outside strings at most MAX_DEPTH (json would recurse into a
    RecursionError long before it said the text is too deep)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _pairs(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = sorted(k for k in keys if keys.count(k) > 1)[0]
        raise RecordError(f"a key appears twice ({twice[:40]!r})")
    return dict(pairs)


def _constant(name):
    raise RecordError(f"{name} is not a number a record holds")


def _finite(literal: str) -> float:
    """A JSON number as a float, never inf (1e999 would read as infinity)."""
    value = float(literal)
    if not math.isfinite(value):
        raise RecordError(f"{literal[:40]} is out of range for a number a record holds")
    return value


def load(text: str, what: str, empty=None):
    """The JSON value of a record's text (`empty` for a file of whitespace only); RecordError
    naming `what` when it is not one."""
    if len(text) > MAX_BYTES:
        raise RecordError(f"{what} is larger than {MAX_BYTES} bytes")
    if text.strip() == NOT_REGULAR:
        raise RecordError(f"{what} is not a regular file (a FIFO, a device or a link)")
    if not text.strip():
        return empty
    if not _depth_ok(text):
        raise RecordError(f"{what} is nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_finite
        )
    except RecordError as exc:
        raise RecordError(f"{what}: {exc}") from None
    except ValueError as exc:
        raise RecordError(f"{what} is not JSON ({str(exc).splitlines()[0][:120]})") from None


# --- field rules ---------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
UNIT_NAME = re.compile(r"servefleet-[a-z0-9][a-z0-9-]{0,62}\.service")
HEX = re.compile(r"[0-9a-f]+")


# optional=False (the default) never answers None: a missing or null field is a RecordError.
@overload
def text(
    doc: dict, key: str, what: str, limit: int = ..., optional: Literal[False] = ...
) -> str: ...
@overload
def text(doc: dict, key: str, what: str, limit: int = ..., *, optional: bool) -> str | None: ...
def text(doc: dict, key: str, what: str, limit: int = 1024, optional: bool = False) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit or _CONTROL.search(value):
        raise RecordError(f"{what}: {key!r} is not a line of text of at most {limit} characters")
    return value


def abs_path(doc: dict, key: str, what: str) -> str:
    """An absolute, normalised path below the root directory (never `/` itself)."""
    value = text(doc, key, what)
    if not (
        value.startswith("/")
        and not value.startswith("//")  # normpath keeps a leading //: //etc is /etc
        and posixpath.normpath(value) == value
        and value.count("/") >= 2
    ):
        raise RecordError(
            f"{what}: {key!r} is not an absolute normalised path below / ({value[:80]!r})"
        )
    return value


@overload
def hex_text(
    doc: dict, key: str, what: str, lengths: tuple[int, ...], optional: Literal[False] = ...
) -> str: ...
@overload
def hex_text(
    doc: dict, key: str, what: str, lengths: tuple[int, ...], *, optional: bool
) -> str | None: ...
def hex_text(
    doc: dict, key: str, what: str, lengths: tuple[int, ...], optional: bool = False
) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not (isinstance(value, str) and len(value) in lengths and HEX.fullmatch(value)):
        raise RecordError(f"{what}: {key!r} is not {'/'.join(map(str, lengths))} hex digits")
    return value


def unit_name(doc: dict, key: str, what: str) -> str:
    value = doc.get(key)
    if not (isinstance(value, str) and UNIT_NAME.fullmatch(value)):
        raise RecordError(
            f"{what}: {key!r} is not a servefleet unit name (servefleet-NAME.service)"
        )
    return value


def only_keys(doc, keys, what: str) -> dict:
    if not isinstance(doc, dict):
        raise RecordError(f"{what} is not an object")
    unknown = sorted(set(doc) - set(keys))
    if unknown:
        raise RecordError(f"{what}: unknown key {unknown[0][:40]!r}")
    return doc
