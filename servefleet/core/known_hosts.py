"""Host keys the operator pinned: one host's keys in an OpenSSH known_hosts file.

Nodes copy models from the depot over SSH with StrictHostKeyChecking=yes against a known_hosts
file servefleet writes for them (servefleet.operations.depot.known_hosts). The keys in it come
from here, the operator's own file, never from the depot: a key read over a connection that
trusted the depot on first use would be whatever answered that connection.

OpenSSH's format (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT): `[marker] patterns keytype base64
[comment]`; patterns are comma-separated names with `*` / `?` wildcards and `!` negation, or
one hashed name `|1|salt|hmac-sha1`; a non-default port is written `[host]:port`;
`@cert-authority` lines name a CA (not a key to pin: skipped), `@revoked` lines a key never to
trust (dropped, whatever host the line names).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
from collections.abc import Sequence

# A known_hosts file of thousands of hosts is a few MiB; a bigger one is not a known_hosts file.
MAX_BYTES = 16 << 20
# Host key types a node's OpenSSH accepts as a plain known_hosts key (not ssh-dss: removed).
KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)


class PinError(ValueError):
    """No pinned key: the message says why, as a phrase ("... holds no key for [a]:2222")."""


def host_name(address: str, port: int) -> str:
    """The name OpenSSH looks a host up by: `address`, or `[address]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def _glob(pattern: bytes, name: bytes) -> bool:
    """OpenSSH's match_pattern (`*` and `?`), iteratively: on a mismatch only the last `*` is
    moved on, so 60 `*` against a long name take O(len(pattern) * len(name)) steps, never the
    exponential backtracking of a regular expression. Same answers: both are exact globs."""
    p = n = 0
    star, mark = -1, 0
    while n < len(name):
        if p < len(pattern) and pattern[p] == 0x2A:  # '*'
            star, mark, p = p, n, p + 1
        elif p < len(pattern) and pattern[p] in (0x3F, name[n]):  # '?' or the same byte
            p, n = p + 1, n + 1
        elif star >= 0:
            mark += 1
            p, n = star + 1, mark
        else:
            return False
    return all(ch == 0x2A for ch in pattern[p:])


def _hashed(field: bytes, name: bytes) -> bool:
    """`|1|base64(salt)|base64(HMAC-SHA1(salt, name))` (ssh-keygen -H) names `name`: OpenSSH
    hashes the name with the line's salt and compares the whole field as text."""
    parts = field.split(b"|")
    if len(parts) != 4 or parts[:2] != [b"", b"1"]:
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
    except (ValueError, binascii.Error):
        return False
    if len(salt) != 20:  # SHA-1's size, as OpenSSH requires
        return False
    mac = hmac.new(salt, name, hashlib.sha1).digest()
    expected = b"|1|" + base64.b64encode(salt) + b"|" + base64.b64encode(mac)
    return hmac.compare_digest(expected, field)


def _ascii_lower(text: bytes) -> bytes:
    return text.lower()  # bytes.lower() changes A-Z only, as OpenSSH's tolower() in C


def names_host(field: str | bytes, name: str | bytes) -> bool:
    """Does a line's host field name `name`? A negated pattern that matches wins. Names and
    patterns compare case-insensitively in ASCII only (OpenSSH lowercases both)."""
    field = field.encode() if isinstance(field, str) else field
    name = _ascii_lower(name.encode() if isinstance(name, str) else name)
    if field.startswith(b"|"):
        return _hashed(field, name)
    named = False
    for pattern in _ascii_lower(field).split(b","):
        if pattern.startswith(b"!"):
            if _glob(pattern[1:], name):
                return False
        elif _glob(pattern, name):
            named = True
    return named


def _blob(token: bytes) -> bytes | None:
    """A key blob as OpenSSH's b64_pton reads it: whitespace inside is skipped (a CR before the
    line end, a form feed), anything else outside base64 makes it no key."""
    compact = bytes(ch for ch in token if ch not in b"\r\x0b\x0c\n ")
    try:
        return base64.b64decode(compact, validate=True)
    except (ValueError, binascii.Error):
        return None


def valid_key(keytype: str, blob: str | bytes) -> bool:
    """A known key type whose base64 blob decodes and names that same type (its first field)."""
    return _key_text(keytype.encode(), blob.encode() if isinstance(blob, str) else blob) is not None


def _key_text(keytype: bytes, token: bytes) -> str | None:
    """`keytype base64` (canonical base64) of a well-formed key, or None."""
    if keytype.decode("ascii", "replace") not in KEY_TYPES:
        return None
    raw = _blob(token)
    if raw is None:
        return None
    size = int.from_bytes(raw[:4], "big")
    if not (len(raw) > 4 + size and raw[4 : 4 + size] == keytype):
        return None
    return f"{keytype.decode()} {base64.b64encode(raw).decode()}"


_BLANK = b" \t"
_MARKERS = (b"@cert-authority", b"@revoked")


def _token(text: bytes, at: int, ends: bytes) -> int:
    """The index where the token starting at `at` ends: the first byte of `ends`, or the end."""
    while at < len(text) and text[at] not in ends:
        at += 1
    return at


def _skip_blank(text: bytes, at: int) -> int:
    while at < len(text) and text[at] in _BLANK:
        at += 1
    return at


def _parts(line: bytes) -> tuple[bytes | None, bytes, bytes, bytes] | None:
    """(marker, hosts, keytype, blob) of one line, as OpenSSH's hostkeys_foreach and sshkey_read
    cut it, or None for a comment or a line without a key. Only spaces and tabs separate
    fields (a form feed, NBSP, U+2028 or U+0085 is part of a field). The line is a C string:
    the host field also ends at a NUL (the key is read after it), and the key's part of the
    line ends at the first NUL after the host field."""
    at = _skip_blank(line, 0)
    if at == len(line) or line[at] in b"\0#":
        return None
    marker = None
    if line[at : at + 1] == b"@":
        end = _token(line, at, _BLANK + b"\0")
        if line[at:end] not in _MARKERS or end == len(line) or line[end] == 0:
            return None  # OpenSSH: a bad marker, the line is skipped
        marker, at = line[at:end], _skip_blank(line, end)
    end = _token(line, at, _BLANK + b"\0")
    hosts = line[at:end]
    if end >= len(line):
        return None  # no key after the names
    rest = line[end + 1 :].split(b"\0", 1)[0]
    at = _skip_blank(rest, 0)
    type_end = _token(rest, at, _BLANK)
    if type_end == len(rest) or rest[at : at + 1] == b"#":
        return None  # a key type must be followed by its blob
    blob_at = _skip_blank(rest, type_end)
    return marker, hosts, rest[at:type_end], rest[blob_at : _token(rest, blob_at, _BLANK)]


def keys_for(text: str | bytes, names: Sequence[str]) -> list[str]:
    """`keytype base64` of every plain key `text` pins for any of `names`, in file order, once
    each; revoked keys left out. Read as OpenSSH reads it (hostfile.c): bytes, lines end at a
    newline only, fields split on spaces and tabs only (_parts); lines that are not
    well-formed are ignored."""
    raw = text.encode() if isinstance(text, str) else text
    found: list[str] = []
    revoked: set[str] = set()
    for line in raw.split(b"\n"):
        parts = _parts(line)
        if parts is None:
            continue
        marker, hosts, keytype, blob = parts
        key = _key_text(keytype, blob)
        if key is None:
            continue
        if marker == b"@revoked":
            revoked.add(key)
        elif marker is None and key not in found and any(names_host(hosts, n) for n in names):
            found.append(key)
    return [key for key in found if key not in revoked]


_cache: dict[tuple, tuple[str, ...]] = {}


def pinned_keys(path: str | None, names: Sequence[str]) -> tuple[str, ...]:
    """The keys the known_hosts file at `path` pins for `names` (`keytype base64` each).
    PinError saying why there are none: no file, one that keeps nothing, no entry."""
    if not path or not path.strip():
        raise PinError("it has no ssh_known_hosts_file")
    path = os.path.expanduser(path)
    try:
        # O_NONBLOCK: a FIFO named here must not hang the run waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise PinError(f"its ssh_known_hosts_file {path} cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PinError(f"its ssh_known_hosts_file {path} keeps no key (not a regular file)")
        if st.st_size > MAX_BYTES:
            raise PinError(f"its ssh_known_hosts_file {path} is larger than {MAX_BYTES} bytes")
        # One parse per file version and names: every node of a fleet asks for the same depot.
        cache_key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, tuple(names))
        if cache_key not in _cache:
            if len(_cache) > 64:  # a long-lived process (servefleet's verbs): bounded
                _cache.clear()
            with os.fdopen(os.dup(fd), "rb") as fh:
                raw = fh.read(MAX_BYTES)  # bytes, as OpenSSH reads it: never decoded
            _cache[cache_key] = tuple(keys_for(raw, names))
    finally:
        os.close(fd)
    keys = _cache[cache_key]
    if not keys:
        raise PinError(
            f"its ssh_known_hosts_file {path} holds no key for " + " or ".join(dict.fromkeys(names))
        )
    return keys
