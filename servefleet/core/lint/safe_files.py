"""Reading untrusted checkpoint files safely: regular files only, bounded in size, inside the
checkpoint directory (symlinks resolved hop by hop), strict JSON; errors are one printable line.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path, PurePosixPath

# Bounds on what a checkpoint's JSON may be: far above real files (a config.json is a few KiB),
# far below what would exhaust memory.
MAX_CONFIG_BYTES = 4 << 20
MAX_SYMLINK_HOPS = 40


class CheckpointError(ValueError):
    """A checkpoint file is malformed or unsafe to read; the message is one line naming the file,
    the key and the problem."""


def one_line(text: str, limit: int = 600) -> str:
    """text with control characters escaped, cut to `limit` characters: one printable line."""
    out = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[:limit] + "..."


def show(value, limit: int = 60) -> str:
    """An untrusted value for an error message: repr, cut short (never a huge or multi-line one)."""
    if isinstance(value, (dict, list)):
        return f"{json_type(value)} of {len(value)}"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def json_type(value) -> str:
    """The JSON name of a parsed value's type."""
    if isinstance(value, bool):
        return "boolean"
    return {
        dict: "object",
        list: "array",
        str: "string",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


# --- files: regular, bounded, inside the checkpoint --------------------------------------------


def read_regular(path: Path, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file of at most max_bytes. Opened without blocking (a FIFO would
    hang a plain open) and, with follow_symlinks=False, refusing a symlink swapped in."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise CheckpointError(
                f"{path}: {st.st_size} bytes: larger than the {max_bytes} such a file may be"
            )
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise CheckpointError(f"{path}: grew past {max_bytes} bytes while being read")
        return data
    finally:
        os.close(fd)


class _JsonRefused(ValueError):
    pass


def _pairs(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRefused(f"duplicate key {show(key)}")
        out[key] = value
    return out


def _constant(name):
    raise _JsonRefused(f"{name} is not a JSON number")


def _float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _JsonRefused(f"number {show(text)} is out of range")
    return value


def _int(text):
    if len(text) > 64:
        raise _JsonRefused(f"integer of {len(text)} digits")
    return int(text)


def parse_json_object(data: bytes, where) -> dict:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity, bounded nesting, an object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{where}: not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
        )
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except _JsonRefused as exc:
        raise CheckpointError(f"{where}: invalid JSON: {exc}") from None
    except RecursionError:
        raise CheckpointError(f"{where}: invalid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise CheckpointError(
            f"{where}: the top level is a JSON {json_type(value)}: expected an object"
        )
    return value


def read_json_object(
    path: Path, max_bytes: int = MAX_CONFIG_BYTES, *, follow_symlinks: bool = True
) -> dict:
    """A JSON file holding one object, read strictly (see parse_json_object)."""
    return parse_json_object(read_regular(path, max_bytes, follow_symlinks=follow_symlinks), path)


def checkpoint_roots(directory: Path) -> tuple[Path, tuple[Path, ...]]:
    """(the checkpoint's real directory, the directories its files may resolve into).

    Files must stay inside the checkpoint. One exception: a Hugging Face cache snapshot
    (.../models--ORG--NAME/snapshots/REV/) holds symlinks into the same repository's blobs/.
    """
    real = Path(os.path.realpath(directory))
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        blobs = real.parent.parent / "blobs"
        if blobs.is_dir() and not blobs.is_symlink():
            roots.append(blobs)
    return real, tuple(roots)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_inside(real_dir: Path, rel: str, roots: tuple[Path, ...]) -> Path | None:
    """The real path of real_dir/rel, resolved one component at a time without touching anything
    outside `roots`: None when it (or a symlink on the way) leads out of them.

    Only components inside a root are lstat'ed; a prefix of a root is a real directory already
    (roots are real paths), and `..` of a real path is its parent.
    """
    pending = list(PurePosixPath(rel).parts)
    current, hops = real_dir, 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "/":
            current = Path("/")
            continue
        if part == "..":
            current = current.parent
            continue
        nxt = current / part
        if any(_within(root, nxt) for root in roots):  # nxt is a root or above one: real
            current = nxt
            continue
        if not any(_within(nxt, root) for root in roots):
            return None
        try:
            st = os.lstat(nxt)
        except (FileNotFoundError, NotADirectoryError):  # absent: nothing further to follow
            return nxt.joinpath(*pending)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise CheckpointError(
                    f"{real_dir}: {show(rel)}: more than {MAX_SYMLINK_HOPS} "
                    f"symlinks to follow (a loop)"
                )
            pending = list(PurePosixPath(os.readlink(nxt)).parts) + pending
            continue
        current = nxt
    return current if any(_within(current, r) and current != r for r in roots) else None
