"""Files the operator names (fleet.yml, api_key_file, hf_token_file, depot_ssh_key), read on the
operator's side: regular files only, opened without blocking, read with a bound.

A plain open() of a FIFO waits for a writer (the run hangs); /dev/zero or /dev/urandom never
end (the run eats memory); a directory or a socket is no file at all. Each is refused with one
line naming the path and what it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


# A private key file is a few hundred bytes (an RSA-8192 one ~6.5 KiB).
MAX_KEY_BYTES = 64 << 10


class FileRefused(ValueError):
    """The path is not a regular file, or is larger than allowed; one line, names the path."""


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def key_file_problem(path, st: os.stat_result, private: bool) -> str | None:
    """Why a key file (a secret, or a private key when `private`) cannot be trusted: whoever
    may change it chooses the key servefleet uses or uploads. Its owner is the operator (the
    user running servefleet) or root, and no group or other user may write it; a private key is
    also readable by no one else, as OpenSSH refuses one. None when it is fine."""
    me, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    if st.st_uid not in (me, 0):
        return (
            f"{path} is owned by uid {st.st_uid}, not by you (uid {me}) or root, so its owner "
            f"chooses the key; expected a file of your own"
        )
    if mode & 0o022:
        return (
            f"{path} is writable by its group or others (mode {mode:04o}), so they choose the "
            f"key; expected chmod go-w"
        )
    if private and mode & 0o077:
        return (
            f"{path} is readable by its group or others (mode {mode:04o}); a private key is "
            f"refused, as OpenSSH refuses it; expected chmod 600"
        )
    return None


def read_regular(path: str | Path, max_bytes: int, key: str | None = None) -> bytes:
    """The bytes of the regular file at `path` (a symlink to one is fine: the operator's own
    files), at most max_bytes. OSError as open() raises it (FileNotFoundError, EACCES);
    FileRefused for anything that is not a regular file or is too large, and for a key file
    (`key` "secret" or "private") that key_file_problem refuses."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(
                f"{path} cannot be read: it is {kind_of(st.st_mode)}, not a regular file"
            )
        problem = key and key_file_problem(path, st, private=key == "private")
        if problem:
            raise FileRefused(problem)
        if st.st_size > max_bytes:
            raise FileRefused(f"{path} is larger than {max_bytes} bytes ({st.st_size})")
        chunks, left = [], max_bytes + 1
        while left > 0:  # bounded even if the file grows while it is read
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise FileRefused(f"{path} is larger than {max_bytes} bytes (it grew while read)")
        return data
    finally:
        os.close(fd)


def ssh_key_problem(value) -> str | None:
    """Why `ssh_key` (the private key pyinfra logs in with) cannot be used, before any
    connection: not a path, ~user of no user, no such file, not a regular file, or one
    key_file_problem refuses. None when it is fine (pyinfra parses it when it connects)."""
    if not isinstance(value, str) or not value:
        return f"{value!r} is not a file path"
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # ~nosuchuser/key
        return f"{value}: ~user names no user on this machine"
    try:
        read_regular(path, MAX_KEY_BYTES, key="private")
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    except FileRefused as exc:
        return str(exc)
    return None
