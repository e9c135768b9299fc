#!/usr/bin/env python3
"""Evict a directory tree's files from the page cache and report the bytes evicted.

Pushed to nodes by servefleet (deploys/serve_bf16.py, page-cache step); standard library only.

    evict.py PATH [--record FILE] [--drop-caches]

Per regular file (symlinks followed, each file once): count its resident pages with mincore(2),
posix_fadvise(POSIX_FADV_DONTNEED) the whole file, count again. Only clean pages that no process
maps can go; dirty pages are written back first (fdatasync). Prints one JSON line:
{"path", "files", "bytes", "resident_before", "resident_after", "evicted", "drop_caches"}.

--drop-caches also writes 1 to /proc/sys/vm/drop_caches (the whole host's clean page cache). Where
/proc/sys is read-only (containers, the systemd-nspawn testbed) that fails: exit status 3, nothing
faked. Exit status 2: PATH is not a directory.
"""

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
MAP_FAILED = ctypes.c_void_p(-1).value
CHUNK = 1 << 30  # map at most 1 GiB at a time: shards are several GB


def resident_bytes(fd, size):
    """Bytes of the file now in the page cache: mincore(2) over a read-only mapping of it."""
    total = 0
    offset = 0
    while offset < size:
        length = min(CHUNK, size - offset)
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (length + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, length, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            resident = sum(1 for v in vec if v & 1)
        finally:
            _libc.munmap(addr, length)
        # The last page of the file counts only up to the file's end.
        total += min(resident * PAGE, length)
        offset += length
    return total


def walk(root):
    """Regular files under root, following symlinks, each real file once."""
    seen = set()
    for directory, _dirs, names in os.walk(root, followlinks=True):
        for name in sorted(names):
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # a dangling link
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen or not os.path.isfile(path):
                continue
            seen.add(key)
            yield path, st.st_size


def evict(root):
    report = {"path": root, "files": 0, "bytes": 0, "resident_before": 0, "resident_after": 0}
    for path, size in walk(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            before = resident_bytes(fd, size) if size else 0
            if before:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            after = resident_bytes(fd, size) if before else 0
        finally:
            os.close(fd)
        report["files"] += 1
        report["bytes"] += size
        report["resident_before"] += before
        report["resident_after"] += after
    report["evicted"] = report["resident_before"] - report["resident_after"]
    return report


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("1\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--record", help="also write the report to this file")
    parser.add_argument("--drop-caches", action="store_true",
                        help="then drop the host's whole clean page cache")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.path):
        print(f"evict: {args.path} is not a directory", file=sys.stderr)
        return 2
    report = evict(args.path)
    report["drop_caches"] = None
    status = 0
    if args.drop_caches:
        try:
            drop_caches()
            report["drop_caches"] = "done"
        except OSError as exc:
            report["drop_caches"] = f"failed: {exc}"
            status = 3
    line = json.dumps(report)
    if args.record:
        tmp = args.record + ".tmp"
        with open(tmp, "w") as handle:
            handle.write(line + "\n")
        os.replace(tmp, args.record)
    print(line)
    if status:
        print(f"evict: /proc/sys/vm/drop_caches: {report['drop_caches']} (read-only /proc/sys? "
              "set page_cache_drop_global = False there)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
