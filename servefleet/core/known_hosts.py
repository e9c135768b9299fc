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
import re
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


def _glob(pattern: str, name: str) -> bool:
    """OpenSSH's match_pattern: `*` and `?` only, case-insensitive (host names are)."""
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, name, re.IGNORECASE | re.DOTALL) is not None


def _hashed(field: str, name: str) -> bool:
    """`|1|base64(salt)|base64(HMAC-SHA1(salt, name))` (ssh-keygen -H) names `name`."""
    try:
        salt, digest = (base64.b64decode(part, validate=True) for part in field[3:].split("|"))
    except (ValueError, binascii.Error):
        return False
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(mac, digest)


def names_host(field: str, name: str) -> bool:
    """Does a line's host field name `name`? A negated pattern that matches wins."""
    if field.startswith("|1|"):
        return _hashed(field, name)
    named = False
    for pattern in field.split(","):
        if pattern.startswith("!"):
            if _glob(pattern[1:], name):
                return False
        elif _glob(pattern, name):
            named = True
    return named


def valid_key(keytype: str, blob: str) -> bool:
    """A known key type whose base64 blob decodes and names that same type (its first field)."""
    if keytype not in KEY_TYPES:
        return False
    try:
        raw = base64.b64decode(blob, validate=True)
    except (ValueError, binascii.Error):
        return False
    size = int.from_bytes(raw[:4], "big")
    return len(raw) > 4 + size and raw[4 : 4 + size] == keytype.encode()


def keys_for(text: str, names: Sequence[str]) -> list[str]:
    """`keytype base64` of every plain key `text` pins for any of `names`, in file order, once
    each; revoked keys left out. Lines that are not well-formed are ignored, as OpenSSH does."""
    found: list[str] = []
    revoked: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if len(fields) < 3 or not valid_key(fields[1], fields[2]):
            continue
        key = f"{fields[1]} {fields[2]}"
        if marker == "@revoked":
            revoked.add(key)
        elif marker is None and key not in found and any(names_host(fields[0], n) for n in names):
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
                text = fh.read(MAX_BYTES).decode("utf-8", errors="replace")
            _cache[cache_key] = tuple(keys_for(text, names))
    finally:
        os.close(fd)
    keys = _cache[cache_key]
    if not keys:
        raise PinError(
            f"its ssh_known_hosts_file {path} holds no key for " + " or ".join(dict.fromkeys(names))
        )
    return keys
