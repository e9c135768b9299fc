"""Apply one unified diff to one file, byte-exact, or change nothing (runs on the node).

Uploaded by servefleet.engines.vllm.operations.patch and run with the node's own venv python,
so nodes need neither `patch` nor servefleet. Standard library only.

    python apply_patch.py TARGET PATCH PRISTINE_SHA256 PATCHED_SHA256

All checks come before any write:
1. TARGET must hash to PRISTINE_SHA256, and an existing TARGET.orig too;
2. the patch is applied in memory, strictly (no fuzz, no offset search), and the
   result must hash to PATCHED_SHA256;
3. TARGET.orig is written once (a copy keeping mode and mtime), never overwritten;
4. the result replaces TARGET atomically (write beside it, then rename).
Every file is opened without following a symlink and without blocking, and must be a
regular file of at most MAX_BYTES (a FIFO would hang the run, a link would write
elsewhere); the temporary files are new, randomly named ones (mkstemp), never a name
someone could plant a symlink at.
Exit status: 0 done, 2 usage, 3 TARGET not pristine, 4 .orig not pristine,
5 patch does not apply or gives the wrong bytes, 6 a file is not a regular file,
7 a write failed.
"""

import contextlib
import errno
import hashlib
import os
import re
import stat
import sys
import tempfile

MAX_BYTES = 16 << 20  # qwen3_5.py is ~60 KB


class NotRegular(Exception):
    """A path is a symlink, FIFO, directory, device or too large: refused (exit 6)."""


def read_regular(path):
    """(bytes, stat) of the regular file at path, never through a symlink (ELOOP), never
    blocking on a FIFO; None when it does not exist."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(f"{path} is a symbolic link") from None
        raise NotRegular(f"{path} cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path} is not a regular file (mode {st.st_mode:o})")
        if st.st_size > MAX_BYTES:
            raise NotRegular(f"{path} is larger than {MAX_BYTES} bytes")
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_BYTES:
            raise NotRegular(f"{path} grew past {MAX_BYTES} bytes while read")
        return data, st
    finally:
        os.close(fd)


HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def apply_unified(original, patch):
    """Return `original` (bytes) with the hunks of `patch` (bytes) applied."""
    src = original.splitlines(keepends=True)
    out = []
    pos = 0  # next unread line of src
    lines = iter(patch.splitlines(keepends=True))
    for line in lines:
        match = HUNK.match(line)
        if not match:
            continue  # file headers (---, +++) and anything between hunks
        old_count = int(match.group(2) or 1)
        new_count = int(match.group(4) or 1)
        # A hunk that removes nothing names the line it inserts *after*.
        start = int(match.group(1)) - (1 if old_count else 0)
        if start < pos:
            raise ValueError("hunks overlap or are out of order")
        out.extend(src[pos:start])
        pos = start
        while old_count or new_count:
            line = next(lines, b"")
            tag, text = line[:1], line[1:]
            if tag in (b" ", b"-"):
                if pos >= len(src) or src[pos].rstrip(b"\r\n") != text.rstrip(b"\r\n"):
                    raise ValueError(f"hunk does not match at line {pos + 1}")
                if tag == b" ":
                    out.append(src[pos])
                    new_count -= 1
                pos += 1
                old_count -= 1
            elif tag == b"+":
                out.append(text)
                new_count -= 1
            else:  # includes "\ No newline at end of file": not needed, so refused
                raise ValueError(f"unsupported patch line {line!r}")
            if old_count < 0 or new_count < 0:
                raise ValueError("hunk longer than its header says")
    out.extend(src[pos:])
    return b"".join(out)


def write_new(path, data, st, replace):
    """Write data to a new random file beside path with the mode (and times) of st, then
    rename it over path (replace) or link it at path, failing if path exists (not replace)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".servefleet-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), stat.S_IMODE(st.st_mode))
        if replace:
            os.replace(tmp, path)
        else:
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # the shipped file's mtime
            os.link(tmp, path)  # never overwrites a backup made meanwhile
    finally:
        with contextlib.suppress(FileNotFoundError):  # gone when renamed into place
            os.unlink(tmp)


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    target, patch_path, pristine, patched = argv[1:]
    try:
        return apply(target, patch_path, pristine, patched)
    except NotRegular as exc:
        print(f"{exc}: refused, nothing was changed", file=sys.stderr)
        return 6
    except OSError as exc:  # a write failed (disk full, a backup made meanwhile): one line
        print(f"{exc.filename}: {exc.strerror}", file=sys.stderr)
        return 7


def apply(target, patch_path, pristine, patched):
    found = read_regular(target)
    if found is None:
        print(f"{target}: does not exist", file=sys.stderr)
        return 3
    original, st = found
    if sha256(original) != pristine:
        print(
            f"{target}: sha256 {sha256(original)} is not the pristine {pristine}", file=sys.stderr
        )
        return 3

    backup = target + ".orig"
    kept = read_regular(backup)
    if kept is not None and sha256(kept[0]) != pristine:
        print(f"{backup}: sha256 {sha256(kept[0])} is not the pristine {pristine}", file=sys.stderr)
        return 4

    patch = read_regular(patch_path)
    if patch is None:
        print(f"{patch_path}: does not exist", file=sys.stderr)
        return 2
    try:
        result = apply_unified(original, patch[0])
    except ValueError as exc:
        print(f"{target}: patch does not apply: {exc}", file=sys.stderr)
        return 5
    if sha256(result) != patched:
        print(f"{target}: patched sha256 {sha256(result)} is not {patched}", file=sys.stderr)
        return 5

    if kept is None:
        write_new(backup, original, st, replace=False)
    write_new(target, result, st, replace=True)
    print(f"patched {target} (sha256 {patched})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
