"""Checks of single data values: each says in words what it expects, for one-line errors.

Every value that reaches a node (a unit file, a path, a shell command) passes one of these
first. The checks refuse what could change the meaning of a unit or a command: control
characters, newlines, whitespace, IPv6 scope ids, `..` in paths. Escaping (systemd, shell)
happens on top of this, where values are written (servefleet.core.systemd, shlex).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servefleet.core import sizes

# Characters that may never reach a node inside a value: C0/C1 controls, DEL, whitespace.
# Whitespace, C0/C1 controls, line separators, and the bidi controls that make text read other
# than it runs ("Trojan Source").
_UNSAFE = re.compile(
    r"[\x00-\x20\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e"
    r"\u2066-\u2069\s]"
)


@dataclass(frozen=True)
class Check:
    expected: str  # the expected form, in words, for error messages
    ok: Callable[[Any], bool]
    # How an accepted value is read, when it may be written in more than one form (a size:
    # 8GiB is 8589934592); None: as it is.
    normal: Callable[[Any], Any] | None = None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v) -> bool:
    return isinstance(v, str)


def safe_text(v) -> bool:
    """A non-empty string with no whitespace or control characters."""
    return _is_str(v) and v != "" and not _UNSAFE.search(v)


# Upper bounds for numbers that reach units, command lines and arithmetic on the node: far above
# any real value, far below what breaks the things they reach (TimeoutStartSec=10^30, -j 10^6).
BYTES_MAX = 2**50  # 1 PiB
SECONDS_MAX = 7 * 86400
TOKENS_MAX = 2**24  # 16.7 M tokens of context
JOBS_MAX = 1024


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    words = "an integer" + (f" >= {lo}" if lo is not None and hi is None else "")
    if lo is not None and hi is not None:
        words = f"an integer from {lo} to {hi}"
    return Check(
        words, lambda v: _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
    )


def size(lo: int, hi: int) -> Check:
    """A byte count (core.sizes): an integer, or 8G / 8GiB / 512M / 1.5GiB, from lo to hi."""

    def ok(v) -> bool:
        try:
            return lo <= sizes.parse_size(v) <= hi
        except sizes.SizeError:
            return False

    top = f"{hi >> 50} PiB" if hi % (1 << 50) == 0 else str(hi)
    return Check(f"{sizes.EXPECTED}, from {lo} to {top}", ok, sizes.parse_size)


def pattern(words: str, regex: str) -> Check:
    compiled = re.compile(regex)
    return Check(words, lambda v: _is_str(v) and compiled.fullmatch(v) is not None)


BOOL = Check("true or false", lambda v: isinstance(v, bool))
TEXT = Check("a non-empty string without spaces or control characters", safe_text)
NAME = pattern("a name of letters, digits, '.', '_' or '-'", r"[A-Za-z0-9][A-Za-z0-9._-]*")
URL = pattern("an http(s) URL without spaces", r"https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")
VERSION = pattern("a release version like 0.24.0", r"\d+(\.\d+)+")
SHA = pattern("a 40-hex git commit sha", r"[0-9a-f]{40}")
REVISION = Check(
    "a branch, tag or 40-hex commit sha (letters, digits, '.', '_', '-', '/'; no '..'; at most "
    "128 characters)",
    lambda v: (
        _is_str(v)
        and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}", v) is not None
        and ".." not in v
        and "//" not in v
        and not v.endswith("/")
        and not v.endswith(".lock")
    ),
)
REPO_ID = Check(
    "a hub repo id like org/name (letters, digits, '.', '_', '-'; no '..')",
    lambda v: (
        _is_str(v)
        and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", v) is not None
        and ".." not in v
    ),
)
# A command-line argument of the engine: no whitespace, quotes, backslashes or control characters.
ARG = pattern(
    "a string without whitespace, quotes, backslashes, control or bidi characters",
    r"[^\s'\"\\\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]+",
)
# A name the API answers to, passed as a flag's value: never a flag itself (the engine's parser
# would read "--trust-remote-code" as its own flag).
SERVED_NAME = Check(
    "a string without whitespace, quotes, backslashes, control or bidi "
    "characters, not starting with '-'",
    lambda v: ARG.ok(v) and not v.startswith("-"),
)

# An account servefleet makes its own (servefleet_user, depot_user): what useradd takes on
# Debian/Ubuntu. Whether the name is free is the node's to say: an account or group it already
# has that is not servefleet's (root, sshd, docker, video, ...) is refused there, before anything
# changes (core.node.account_problem, the one rule).
ACCOUNT = Check(
    "a name for an account of servefleet's own (lowercase letters, digits, '_', '-'; at most "
    "32); one the node already has for another account or group is refused on the node",
    lambda v: _is_str(v) and re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", v) is not None,
)


def _ip_ok(v) -> bool:
    # No scope ids (fe80::1%eth0): '%' in a unit is a specifier and the id is free text.
    if not _is_str(v) or re.fullmatch(r"[0-9A-Fa-f:.]+", v) is None:
        return False
    try:
        ipaddress.ip_address(v)
    except ValueError:
        return False
    return True


IP = Check("an IP address without a scope id (0.0.0.0 binds every interface)", _ip_ok)


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


# --- paths ------------------------------------------------------------------------------------

_PATH_CHARS = re.compile(r"/[A-Za-z0-9._/@+-]*")


def clean_abs_path(v) -> bool:
    """Absolute, already normal (no '.', '..', '//', trailing '/'), from a safe character set."""
    return (
        _is_str(v)
        and _PATH_CHARS.fullmatch(v) is not None
        and posixpath.normpath(v) == v
        and not v.startswith("//")
    )


ABS_PATH = Check(
    "an absolute, normalised path (letters, digits, '._-+@/'; no '..', no spaces)", clean_abs_path
)

# Where a directory servefleet owns, hands to its service user and deletes in (servefleet_root,
# models_root, depot_store) may be: exact shapes, not allowed parents with a deny list inside
# them. In the trees that packages and root's own services share (/opt/nvidia, /srv/salt,
# /var/lib/docker, /var/lib/cloud, ...) only a name of servefleet's own, one level down (and its
# models/ or depot/, the defaults' places); on the
# operator's own mounts up to three plain names. The node side (core.node.dedicated_dir_problem)
# then asks that it be absent or servefleet's, under directories only root writes.
_OWN_NAME = r"servefleet(?:[-_.][A-Za-z0-9._-]{1,64})?"
_PLAIN_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
SHARED_TREES = ("/opt", "/srv", "/var/lib", "/var/opt")
OPERATOR_MOUNTS = ("/data", "/mnt", "/scratch")
_SHARED = "|".join(map(re.escape, SHARED_TREES))
_MOUNTS = "|".join(map(re.escape, OPERATOR_MOUNTS))
DEDICATED_PLACES = (
    re.compile(f"(?:{_SHARED})/{_OWN_NAME}(?:/models|/depot)?"),
    re.compile(f"(?:{_MOUNTS})(?:/{_PLAIN_NAME}){{1,3}}"),
)
DEDICATED_EXPECTED = (
    "a directory of servefleet's own: servefleet or servefleet-NAME (or its models or depot) in "
    f"{', '.join(SHARED_TREES)}, or one to three plain names in {', '.join(OPERATOR_MOUNTS)} "
    "(e.g. /opt/servefleet, /data/models)"
)


def dedicated_dir_problem(path: str) -> str | None:
    """Why `path` cannot be a directory servefleet owns and deletes in; None when it can."""
    if not clean_abs_path(path):
        return ABS_PATH.expected
    if not any(place.fullmatch(path) for place in DEDICATED_PLACES):
        return f"{path} is not {DEDICATED_EXPECTED}"
    return None


DEDICATED_DIR = Check(DEDICATED_EXPECTED, lambda v: dedicated_dir_problem(v) is None)


def inside(path: str, parent: str) -> bool:
    """Is the normalised `path` strictly inside `parent`?"""
    p, q = posixpath.normpath(path), posixpath.normpath(parent)
    return p != q and p.startswith(q.rstrip("/") + "/")


# --- combinators ------------------------------------------------------------------------------


def one_of(*choices) -> Check:
    return Check("one of " + ", ".join(repr(c) for c in choices), lambda v: v in choices)


def optional(check: Check) -> Check:
    inner = check.normal
    normal = None if inner is None else (lambda v: None if v is None else inner(v))
    return Check(f"{check.expected} or None", lambda v: v is None or check.ok(v), normal)


def list_of(check: Check, non_empty: bool = False) -> Check:
    words = f"a {'non-empty ' if non_empty else ''}list, each {check.expected}"
    return Check(
        words,
        lambda v: (
            isinstance(v, (list, tuple))
            and (len(v) > 0 or not non_empty)
            and all(check.ok(x) for x in v)
        ),
    )


def dict_of(key: Check, value: Check) -> Check:
    return Check(
        f"a dict of {key.expected} -> {value.expected}",
        lambda v: isinstance(v, dict) and all(key.ok(k) and value.ok(x) for k, x in v.items()),
    )


def show(value) -> str:
    """A value as an error message shows it: repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."
