#!/usr/bin/env python3
"""servefleet's node-side model fetcher: download, verify every byte, then mark the model ready.

Pushed by servefleet/models.py to {servefleet_root}/tools/fetch_model.py and run as the service
user with the tools venv's python (standard library only; the hub path calls the `hf` CLI):

    fetch_model.py REQUEST.json

REQUEST (written by the operator side; never holds a secret, the token is a file path):

    {"source": "hub" | "depot", "repo_id", "revision", "sha", "include": [...], "dest",
     "margin_bytes",
     # hub: what the hub's tree API lists for the selected files
     "endpoint", "hf", "hf_home", "token_file", "files": [{"path", "size", "sha256", "oid"}],
     # depot: where the depot's verified copy is (rsync over SSH, read-only account)
     "depot": {"host", "port", "user", "path", "key", "known_hosts", "bwlimit_kib"}}

Steps (each run, from a state that may be empty, partial, corrupt or from another revision):
  1. drop the "ready" record; depot: fetch the depot's manifest (its record) first
  2. delete files of another size than expected (truncated) and files not in the model (stale)
  3. free disk >= bytes still to fetch + margin, or fail before fetching a byte
  4. fetch: `hf download --local-dir` (completed files are kept; a partial file is fetched again)
     or `rsync --partial` from the depot (a partial file is resumed)
  5. verify: size and sha256 of every file (the hub's LFS oid; git blob sha1 for small files);
     a mismatching file is deleted, named, and the run fails: the next run fetches it again
  6. write DEST/.servefleet/verified.json: repo_id, revision, sha, include, files {path: size},
     sha256 {path: hex}: the manifest a depot serves to the nodes that copy from it. The same
     record goes to descriptor 3 when the request names it ("record_fd"): root opened it on a
     file in its own state/, and that copy, out of the engine's reach, is what says "complete
     and verified".

The directory is the engine's to write too, so nothing here follows a symlink: links found in
it are removed (the link, never its target), and every open and delete goes component by
component with O_NOFOLLOW, refusing a link planted meanwhile.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

RECORD_DIR = ".servefleet"  # servefleet's own files inside a model directory
# rsync keeps an interrupted file here (relative: in the file's own directory) and resumes from it.
# Not absolute: rsync 3.2.7 then fails the whole-file check of a file rebuilt from that basis.
PARTIAL_DIR = ".rsync-partial"
RECORD = f"{RECORD_DIR}/verified.json"
HF_META_DIR = ".cache/huggingface"  # what `hf download --local-dir` keeps beside the files
_CHUNK = 8 * 1024 * 1024
SAFE_PATH = re.compile(r"[A-Za-z0-9._/+@=-]+")  # as the operator side's safe_repo_path


class Failure(Exception):
    """A runtime failure of this host: printed as one line, exit status 1."""


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(msg: str) -> str:
    """A message for the operator, whole and on one line, whatever bytes a file name in it
    holds: a byte that is not UTF-8 as \\xNN, a newline or a control character escaped (the
    operator's side reads node output as UTF-8 lines)."""
    text = msg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _UNPRINTABLE.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def log(msg: str) -> None:
    print(one_line(f"servefleet: {msg}"), flush=True)


# -- pure helpers (unit-tested on the operator side) -------------------------------------------


def safe_relpath(path) -> bool:
    """A file path a hub or depot may name: relative, normal, no '..', no control characters."""
    return (
        isinstance(path, str)
        and path != ""
        and not path.startswith("/")
        and all(part not in ("", ".", "..") for part in path.split("/"))
        and all(32 < ord(c) < 127 and c not in "\\'\"" for c in path)
    )


def bounded_dest(dest: str, root: str) -> Path:
    """dest, resolved, strictly inside root (resolved): every write and delete of this run
    happens under it. Refuses a dest that is root itself, outside it, or reached through a
    symlink that leaves it."""
    real_root = Path(os.path.realpath(root))
    real_dest = Path(os.path.realpath(dest))
    if real_dest == real_root or real_root not in real_dest.parents:
        raise Failure(f"the model directory {dest} is not inside {root}; nothing was fetched")
    return Path(dest)


def matches(path: str, include: list[str]) -> bool:
    """huggingface_hub's allow_patterns semantics: fnmatch, a trailing '/' means the whole folder."""
    return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in include)


def bytes_to_fetch(expected: dict[str, int], present: dict[str, int]) -> int:
    """Bytes still to fetch: every expected file not already present at its full size."""
    return sum(size for path, size in expected.items() if present.get(path) != size)


def disk_problem(
    expected: dict[str, int], present: dict[str, int], free: int, margin: int
) -> str | None:
    need = bytes_to_fetch(expected, present)
    if free >= need + margin:
        return None
    return (
        f"not enough free disk: {need / 1e9:.2f} GB to fetch + {margin / 1e9:.2f} GB margin "
        f"= {(need + margin) / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free"
    )


# -- no symlink followed ------------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(dest: Path, parts: list[str]) -> int:
    """A descriptor of dest/parts..., each component opened without following a symlink
    (OSError ELOOP/ENOTDIR when one is a link or not a directory)."""
    fd = os.open(dest, _DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        raise
    return fd


def open_file(dest: Path, rel: str) -> int | None:
    """A read descriptor of the regular file dest/rel, or None when it is not one (missing, a
    link, a FIFO, a device): nothing on the way is followed, nothing blocks."""
    *parts, name = rel.split("/")
    try:
        dfd = open_dir(dest, parts)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def unlink_inside(dest: Path, rel: str) -> None:
    """Delete dest/rel itself (a link is removed, never its target). A symlink in place of a
    directory on the way is refused: the delete would land outside dest."""
    *parts, name = rel.split("/")
    try:
        dfd = open_dir(dest, parts)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise Failure(
            f"{dest}/{rel}: a directory on the way is a symlink or not a directory "
            f"({exc.strerror}); refused, nothing outside {dest} is touched"
        ) from None
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise Failure(f"{dest}/{rel} is a directory where a file belongs; refused") from None
    finally:
        os.close(dfd)


def remove_links(dest: Path) -> None:
    """Remove every symlink in dest (servefleet's and hf's folders included): a model directory
    holds none (hf --local-dir and rsync -a from a verified copy write regular files), and a
    planted one would lead reads, deletes or the record out of it."""
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                log(f"removing the symlink {p.relative_to(dest)} (a model directory holds none)")
                unlink_inside(dest, str(p.relative_to(dest)))


def _digest(fd: int, digest) -> str:
    """Hash what fd reads to its end; closes fd."""
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_file(dest: Path, rel: str, want: dict) -> tuple[str | None, str | None]:
    """(problem or None, sha256 or None) of one file against {size, sha256?, oid?}."""
    fd = open_file(dest, rel)
    if fd is None:
        return "missing or not a regular file", None
    size = os.fstat(fd).st_size
    if size != want["size"]:
        os.close(fd)
        return f"size {size} != expected {want['size']}", None
    got = _digest(os.dup(fd), hashlib.sha256())
    if want.get("sha256"):
        os.close(fd)
        if got != want["sha256"]:
            return f"sha256 {got} != expected {want['sha256']}", got
    elif want.get("oid"):
        os.lseek(fd, 0, os.SEEK_SET)
        blob = _digest(fd, hashlib.sha1(b"blob %d\0" % size))
        if blob != want["oid"]:
            return f"git blob sha1 {blob} != expected {want['oid']}", got
    else:
        os.close(fd)
        return "no checksum to verify against", got
    return None, got


# -- the model directory -----------------------------------------------------------------------


def present_files(dest: Path) -> dict[str, int]:
    """path -> size of every entry but a directory in dest (servefleet's and hf's own folders
    excluded): a link, FIFO or device is listed too (size -1, never right), so that it is
    removed as not expected."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(dest):
        rel_dir = os.path.relpath(dirpath, dest)
        dirnames[:] = [
            d
            for d in dirnames
            if d != PARTIAL_DIR and not (rel_dir == "." and d in (RECORD_DIR, ".cache"))
        ]
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            st = os.lstat(Path(dirpath) / name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            out[rel] = st.st_size if stat.S_ISREG(st.st_mode) else -1
    return out


def forget(dest: Path, rel: str) -> None:
    """Delete a file and what hf remembers about it, so the next fetch gets it again."""
    unlink_inside(dest, rel)
    unlink_inside(dest, f"{HF_META_DIR}/download/{rel}.metadata")


def write_json_atomic(dest: Path, rel: str, doc: dict) -> None:
    """dest/rel, replaced whole, written through a directory descriptor (no link followed)."""
    *parts, name = rel.split("/")
    dfd = open_dir(dest, parts)
    tmp = f".tmp-{os.getpid()}-{name}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# -- sources -----------------------------------------------------------------------------------


def rsync_stats(text: str) -> dict[str, int]:
    """`rsync --stats` lines like "Matched data: 1,234 bytes" as {name: int}."""
    out = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        value = rest.strip().split(" ")[0].replace(",", "") if sep else ""
        if value.isdigit():
            out[name.strip()] = int(value)
    return out


def _ssh_command(depot: dict) -> str:
    return " ".join(
        shlex.quote(a)
        for a in [
            "ssh",
            "-i",
            depot["key"],
            "-p",
            str(depot.get("port") or 22),
            "-o",
            f"UserKnownHostsFile={depot['known_hosts']}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=15",
            "-o",
            "ServerAliveInterval=15",
        ]
    )


def _rsync(
    depot: dict, remote: str, local: Path, list_file: Path | None = None, partial: bool = False
) -> None:
    host = depot["host"]
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    cmd = ["rsync", "-a", "--no-owner", "--no-group", "-e", _ssh_command(depot)]
    if partial:  # an interrupted file is kept and resumed (delta) by the next run
        cmd += [f"--partial-dir={PARTIAL_DIR}"]
    if depot.get("bwlimit_kib"):
        cmd += [f"--bwlimit={int(depot['bwlimit_kib'])}"]
    if list_file:
        cmd += [f"--files-from={list_file}"]
    cmd += [f"{depot['user']}@{host}:{remote}", str(local)]
    if partial:
        cmd += ["--stats"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Failure(
            f"rsync from depot {depot['host']} failed ({proc.returncode}): "
            f"{proc.stderr.strip()[-800:]}"
        )
    if partial:
        stats = rsync_stats(proc.stdout)
        log(
            f"rsync: {stats.get('Total bytes received', 0)} bytes received, "
            f"{stats.get('Matched data', 0)} bytes reused from files already here"
        )


MAX_MANIFEST_BYTES = 64 << 20  # a depot's record: far above a real one (a few KiB per file)
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _constant(name):
    raise ValueError(f"{name} is not a JSON number")


def manifest_files(doc, req: dict) -> dict[str, dict]:
    """{path: {size, sha256}} of the depot's record doc for the request; Failure (one line) for
    a record of another repo or sha, or one that is not the shape the fetcher writes."""
    want = f"{req['repo_id']}@{req['sha']}"
    if not isinstance(doc, dict):
        raise Failure(f"the depot's manifest for {want} is not a JSON object")
    if doc.get("repo_id") != req["repo_id"] or doc.get("sha") != req["sha"]:
        raise Failure(
            f"the depot's manifest is for {str(doc.get('repo_id'))[:100]}@"
            f"{str(doc.get('sha'))[:40]}, expected {want}"
        )
    files, sums = doc.get("files"), doc.get("sha256")
    if not isinstance(files, dict) or not isinstance(sums, dict):
        raise Failure(f"the depot's manifest for {want} has no files/sha256 objects")
    out = {}
    for path, size in files.items():
        digest = sums.get(path)
        # (a path out of the directory is refused with the others in run(): safe_relpath)
        if (
            not isinstance(path, str)
            or not SAFE_PATH.fullmatch(path)
            or len(path) > 1024
            or any(len(p) > 200 for p in path.split("/"))
        ):
            raise Failure(
                f"the depot's manifest for {want} names {str(path)[:100]!r}, expected "
                f"a path of short names (letters, digits, ._/+@=-)"
            )
        if type(size) is not int or not 0 <= size < 1 << 50:
            raise Failure(
                f"the depot's manifest for {want}: size of {path[:100]!r} is "
                f"{str(size)[:40]!r}, expected a byte count"
            )
        if not isinstance(digest, str) or not HEX64.fullmatch(digest):
            raise Failure(
                f"the depot's manifest for {want}: sha256 of {path[:100]!r} is "
                f"{str(digest)[:80]!r}, expected 64 hex digits"
            )
        if matches(path, req["include"]):
            out[path] = {"size": size, "sha256": digest}
    return out


def depot_manifest(req: dict, dest: Path) -> dict[str, dict]:
    """The depot's verified record of this repo@sha: the files and sha256s nodes verify against."""
    depot = req["depot"]
    rel = f"{RECORD_DIR}/depot-manifest.json"
    unlink_inside(dest, rel)
    try:
        _rsync(depot, f"{depot['path']}/{RECORD}", dest / rel)
    except Failure as exc:
        raise Failure(
            f"depot {depot['host']} has no verified copy of {req['repo_id']}@{req['sha']} "
            f"(add it to depot_models and run deploys/depot.py): {exc}"
        ) from None
    fd = open_file(dest, rel)
    if fd is None:
        raise Failure(
            f"the depot's manifest for {req['repo_id']}@{req['sha']} is not a regular file"
        )
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise Failure(
            f"the depot's manifest for {req['repo_id']}@{req['sha']} is larger than "
            f"{MAX_MANIFEST_BYTES} bytes"
        )
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_constant)
    except (ValueError, RecursionError) as exc:
        raise Failure(
            f"the depot's manifest for {req['repo_id']}@{req['sha']} is not valid JSON "
            f"({str(exc)[:200]})"
        ) from None
    files = manifest_files(doc, req)
    if not files:
        raise Failure(
            f"no file of the depot's {req['repo_id']}@{req['sha']} matches "
            f"include {req['include']} (the depot has {sorted(doc['files'])[:20]})"
        )
    return files


def fetch_hub(req: dict, dest: Path) -> None:
    Path(req["hf_home"]).mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": req["hf_home"],
        "HF_HOME": req["hf_home"],
        "HF_ENDPOINT": req["endpoint"],
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1" if not req.get("token_file") else "0",
        "LANG": "C.UTF-8",
    }
    if req.get("token_file"):
        env["HF_TOKEN_PATH"] = req["token_file"]  # the client reads the token from this file
    cmd = [
        req["hf"],
        "download",
        req["repo_id"],
        "--revision",
        req["sha"],
        "--local-dir",
        str(dest),
    ]
    for pattern in req["include"]:
        cmd += ["--include", pattern]
    log(
        f"hf download {req['repo_id']}@{req['sha'][:12]} from {req['endpoint']} "
        f"(include {req['include']})"
    )
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise Failure(f"hf download failed ({proc.returncode}): {proc.stdout.strip()[-1500:]}")


def fetch_depot(req: dict, dest: Path, files: dict[str, dict]) -> None:
    depot = req["depot"]
    list_file = dest / RECORD_DIR / "depot-files.txt"
    unlink_inside(dest, f"{RECORD_DIR}/depot-files.txt")
    fd = os.open(list_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{p}\n" for p in sorted(files)))
    log(f"rsync {req['repo_id']}@{req['sha'][:12]} from depot {depot['host']} ({len(files)} files)")
    _rsync(depot, f"{depot['path']}/", dest, list_file=list_file, partial=True)


# -- main --------------------------------------------------------------------------------------


def run(req: dict) -> dict:
    dest = bounded_dest(req["dest"], req["root"])
    dest.mkdir(parents=True, exist_ok=True)
    bounded_dest(req["dest"], req["root"])  # again, now that it exists (no symlink swapped in)
    if dest.is_symlink():
        raise Failure(f"the model directory {dest} is a symlink; refused, nothing was fetched")
    remove_links(dest)
    try:
        os.mkdir(RECORD_DIR, dir_fd=(dfd := open_dir(dest, [])))
    except FileExistsError:
        pass
    finally:
        os.close(dfd)
    unlink_inside(dest, RECORD)  # from here until verified, the model is not ready

    if req["source"] == "depot":
        expected = depot_manifest(req, dest)
    else:
        expected = {
            f["path"]: {"size": f["size"], "sha256": f.get("sha256"), "oid": f.get("oid")}
            for f in req["files"]
        }

    outside = sorted(p for p in expected if not safe_relpath(p))
    if outside:
        raise Failure(
            f"{req['source']} names files outside the model directory "
            f"({', '.join(repr(p) for p in outside[:3])}); refused, nothing was fetched"
        )
    present = present_files(dest)
    for rel in sorted(present):
        if rel not in expected:
            log(f"removing {rel} (not part of {req['repo_id']}@{req['sha'][:12]})")
            forget(dest, rel)
        elif present[rel] != expected[rel]["size"]:
            log(f"removing {rel} (size {present[rel]}, expected {expected[rel]['size']})")
            forget(dest, rel)
    present = present_files(dest)

    sizes = {p: w["size"] for p, w in expected.items()}
    problem = disk_problem(sizes, present, free_bytes(dest), int(req.get("margin_bytes") or 0))
    if problem:
        raise Failure(f"{problem} under {dest}; nothing was fetched")

    started = time.monotonic()
    if bytes_to_fetch(sizes, present):
        if req["source"] == "depot":
            fetch_depot(req, dest, expected)
        else:
            fetch_hub(req, dest)
    fetched = time.monotonic() - started

    bad, sha256 = [], {}
    for rel in sorted(expected):
        problem, digest = check_file(dest, rel, expected[rel])
        if problem:
            bad.append(f"{rel}: {problem}")
            forget(dest, rel)
        else:
            sha256[rel] = digest
    if bad:
        raise Failure(
            f"verification of {req['repo_id']}@{req['sha'][:12]} failed; deleted, the next "
            "run fetches again: " + "; ".join(bad)
        )

    doc = {
        "repo_id": req["repo_id"],
        "revision": req["revision"],
        "sha": req["sha"],
        "include": list(req["include"]),
        "source": req["source"],
        "files": sizes,
        "sha256": sha256,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(dest, RECORD, doc)
    if req.get("record_fd") is not None:  # root's copy: the one that says "verified"
        with os.fdopen(int(req["record_fd"]), "w") as out:
            json.dump(doc, out, indent=1, sort_keys=True)
            out.write("\n")
    total = sum(sizes.values())
    log(
        f"verified {len(sizes)} files ({total / 1e6:.1f} MB) of {req['repo_id']}@{req['sha'][:12]} "
        f"in {dest} (fetch {fetched:.1f} s)"
    )
    return doc


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    req = json.loads(Path(argv[1]).read_text())
    try:
        run(req)
    except Failure as exc:
        print(one_line(f"servefleet: {exc}"), file=sys.stderr, flush=True)
        return 1
    except OSError as exc:  # a name too long, a file where the model directory goes, ...
        print(
            one_line(
                f"servefleet: cannot fetch {req.get('repo_id')}@"
                f"{str(req.get('sha'))[:12]}: {exc.strerror or exc}: "
                f"{str(exc.filename)[:200]}"
            ),
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
