#!/usr/bin/env python3
"""Evict a directory tree's files from the page cache and report the bytes evicted.

Pushed to nodes by servefleet (deploys/serve_bf16.py, page-cache step); standard library only.

    evict.py PATH [--user USER] [--record FILE] [--drop-caches]

Per regular file: count its resident pages with mincore(2), posix_fadvise(POSIX_FADV_DONTNEED)
the whole file, count again. Only clean pages that no process maps can go; dirty pages are written
back first (fdatasync). Prints one JSON line:
{"path", "files", "bytes", "resident_before", "resident_after", "evicted", "drop_caches"}.

The tree is the engine's to write (the models root), so it is walked as its owner: with --user,
a child process drops to USER before it opens anything, and root keeps only what needs root (the
record in its state directory, /proc/sys/vm/drop_caches). No symlink is followed (a planted
`etc -> /etc` is not walked, a `a -> .` loop not entered); FIFOs, devices and sockets are skipped
without being opened for blocking reads.

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
import pwd
import stat
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
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
    """(path, open fd) of each regular file under root, each once; symlinks are not followed,
    neither as directories (os.walk's default) nor as files (O_NOFOLLOW)."""
    seen = set()
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for directory, _dirs, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(directory, name)
            try:
                fd = os.open(path, flags)
            except OSError:  # a symlink (ELOOP), gone, or not ours to read
                continue
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in seen or not stat.S_ISREG(st.st_mode):
                os.close(fd)
                continue
            seen.add(key)
            yield path, fd, st.st_size


def evict(root):
    report = {"path": root, "files": 0, "bytes": 0, "resident_before": 0, "resident_after": 0}
    for _path, fd, size in walk(root):
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


MAX_REPORT = 1 << 16  # the child's one JSON line


def evict_as(user, root):
    """evict(root) in a child that runs as user: the report it printed, parsed."""
    account = pwd.getpwnam(user)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing opened under root's identity
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            line = json.dumps(evict(root)).encode()
            os.write(write, line[:MAX_REPORT])
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - reported by the parent, one line
            os.write(write, json.dumps({"error": str(exc)[:500]}).encode())
            os._exit(1)
    os.close(write)
    chunks, size = [], 0
    while size <= MAX_REPORT:
        chunk = os.read(read, 4096)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    try:
        report = json.loads(b"".join(chunks)[: MAX_REPORT + 1])
    except ValueError:
        report = {"error": "the child's report is not JSON"}
    if status != 0 or not isinstance(report, dict) or "error" in report:
        raise OSError(
            f"evicting as {user} failed: {report.get('error') if isinstance(report, dict) else report}"
        )
    keys = ("files", "bytes", "resident_before", "resident_after", "evicted")
    if not all(isinstance(report.get(k), int) for k in keys):
        raise OSError(f"evicting as {user}: an incomplete report")
    return {"path": root, **{k: report[k] for k in keys}}


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("1\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--user", help="walk and evict as this user (the tree's owner)")
    parser.add_argument("--record", help="also write the report to this file")
    parser.add_argument(
        "--drop-caches", action="store_true", help="then drop the host's whole clean page cache"
    )
    args = parser.parse_args(argv)
    if os.path.islink(args.path) or not os.path.isdir(args.path):
        print(f"evict: {args.path} is not a directory", file=sys.stderr)
        return 2
    try:
        report = evict_as(args.user, args.path) if args.user else evict(args.path)
    except (OSError, KeyError) as exc:
        print(f"evict: {exc}", file=sys.stderr)
        return 1
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
        print(
            f"evict: /proc/sys/vm/drop_caches: {report['drop_caches']} (read-only /proc/sys? "
            "set page_cache_drop_global = False there)",
            file=sys.stderr,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
