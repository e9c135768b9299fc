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


class FileRefused(ValueError):
    """The path is not a regular file, or is larger than allowed; one line, names the path."""


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (a symlink to one is fine: the operator's own
    files), at most max_bytes. OSError as open() raises it (FileNotFoundError, EACCES);
    FileRefused for anything that is not a regular file or is too large."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(
                f"{path} cannot be read: it is {kind_of(st.st_mode)}, not a regular file"
            )
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
