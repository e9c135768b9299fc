"""Apply one unified diff to one file, byte-exact, or change nothing (runs on the node).

Uploaded by servefleet.operations.vllm_patch and run with the node's own venv python,
so nodes need neither `patch` nor servefleet. Standard library only.

    python apply_patch.py TARGET PATCH PRISTINE_SHA256 PATCHED_SHA256

All checks come before any write:
1. TARGET must hash to PRISTINE_SHA256, and an existing TARGET.orig too;
2. the patch is applied in memory, strictly (no fuzz, no offset search), and the
   result must hash to PATCHED_SHA256;
3. TARGET.orig is written once (a copy keeping mode and mtime), never overwritten;
4. the result replaces TARGET atomically (write beside it, then rename).
Exit status: 0 done, 2 usage, 3 TARGET not pristine, 4 .orig not pristine,
5 patch does not apply or gives the wrong bytes.
"""

import hashlib
import os
import re
import shutil
import sys

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


def write_atomic(path, data, like):
    """Write `data` next to `path` then rename over it, with the mode of `like`."""
    tmp = f"{path}.servefleet-tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
    shutil.copymode(like, tmp)
    os.replace(tmp, path)


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    target, patch_path, pristine, patched = argv[1:]
    with open(target, "rb") as handle:
        original = handle.read()
    if sha256(original) != pristine:
        found = sha256(original)
        print(f"{target}: sha256 {found} is not the pristine {pristine}", file=sys.stderr)
        return 3

    backup = target + ".orig"
    if os.path.exists(backup):
        with open(backup, "rb") as handle:
            found = sha256(handle.read())
        if found != pristine:
            print(f"{backup}: sha256 {found} is not the pristine {pristine}", file=sys.stderr)
            return 4

    with open(patch_path, "rb") as handle:
        try:
            result = apply_unified(original, handle.read())
        except ValueError as exc:
            print(f"{target}: patch does not apply: {exc}", file=sys.stderr)
            return 5
    if sha256(result) != patched:
        print(f"{target}: patched sha256 {sha256(result)} is not {patched}", file=sys.stderr)
        return 5

    if not os.path.exists(backup):
        tmp = backup + ".servefleet-tmp"
        shutil.copy2(target, tmp)  # keeps mode and mtime of the shipped file
        os.replace(tmp, backup)
    write_atomic(target, result, like=target)
    print(f"patched {target} (sha256 {patched})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
