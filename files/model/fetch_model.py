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
     sha256 {path: hex}. Its presence means "complete and verified"; it is also the manifest a
     depot serves to the nodes that copy from it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORD_DIR = ".servefleet"  # servefleet's own files inside a model directory
# rsync keeps an interrupted file here (relative: in the file's own directory) and resumes from it.
# Not absolute: rsync 3.2.7 then fails the whole-file check of a file rebuilt from that basis.
PARTIAL_DIR = ".rsync-partial"
RECORD = f"{RECORD_DIR}/verified.json"
HF_META_DIR = ".cache/huggingface"  # what `hf download --local-dir` keeps beside the files
_CHUNK = 8 * 1024 * 1024


class Failure(Exception):
    """A runtime failure of this host: printed as one line, exit status 1."""


def log(msg: str) -> None:
    print(f"servefleet: {msg}", flush=True)


# -- pure helpers (unit-tested on the operator side) -------------------------------------------


def safe_relpath(path) -> bool:
    """A file path a hub or depot may name: relative, normal, no '..', no control characters."""
    return (isinstance(path, str) and path != "" and not path.startswith("/")
            and all(part not in ("", ".", "..") for part in path.split("/"))
            and all(32 < ord(c) < 127 and c not in "\\'\"" for c in path))


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


def disk_problem(expected: dict[str, int], present: dict[str, int], free: int, margin: int) -> str | None:
    need = bytes_to_fetch(expected, present)
    if free >= need + margin:
        return None
    return (f"not enough free disk: {need / 1e9:.2f} GB to fetch + {margin / 1e9:.2f} GB margin "
            f"= {(need + margin) / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free")


def git_blob_sha1_file(path: Path, size: int) -> str:
    digest = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_file(path: Path, want: dict) -> tuple[str | None, str | None]:
    """(problem or None, sha256 or None) of one file against {size, sha256?, oid?}."""
    if not path.is_file():
        return "missing", None
    size = path.stat().st_size
    if size != want["size"]:
        return f"size {size} != expected {want['size']}", None
    got = sha256_file(path)
    if want.get("sha256"):
        if got != want["sha256"]:
            return f"sha256 {got} != expected {want['sha256']}", got
    elif want.get("oid"):
        blob = git_blob_sha1_file(path, size)
        if blob != want["oid"]:
            return f"git blob sha1 {blob} != expected {want['oid']}", got
    else:
        return "no checksum to verify against", got
    return None, got


# -- the model directory -----------------------------------------------------------------------


def present_files(dest: Path) -> dict[str, int]:
    """path -> size of the model's files in dest (servefleet's and hf's own folders excluded)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(dest):
        rel_dir = os.path.relpath(dirpath, dest)
        dirnames[:] = [d for d in dirnames if d != PARTIAL_DIR
                       and not (rel_dir == "." and d in (RECORD_DIR, ".cache"))]
        for name in filenames:
            p = Path(dirpath) / name
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if p.is_file() and not p.is_symlink():
                out[rel] = p.stat().st_size
    return out


def forget(dest: Path, rel: str) -> None:
    """Delete a file and what hf remembers about it, so the next fetch gets it again."""
    for p in (dest / rel, dest / HF_META_DIR / "download" / f"{rel}.metadata"):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def write_json_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


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
    return " ".join(shlex.quote(a) for a in [
        "ssh", "-i", depot["key"], "-p", str(depot.get("port") or 22),
        "-o", f"UserKnownHostsFile={depot['known_hosts']}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=15",
        "-o", "ServerAliveInterval=15",
    ])


def _rsync(depot: dict, remote: str, local: Path, list_file: Path | None = None,
           partial: bool = False) -> None:
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
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise Failure(f"rsync from depot {depot['host']} failed ({proc.returncode}): "
                      f"{proc.stderr.strip()[-800:]}")
    if partial:
        stats = rsync_stats(proc.stdout)
        log(f"rsync: {stats.get('Total bytes received', 0)} bytes received, "
            f"{stats.get('Matched data', 0)} bytes reused from files already here")


def depot_manifest(req: dict, dest: Path) -> dict[str, dict]:
    """The depot's verified record of this repo@sha: the files and sha256s nodes verify against."""
    depot = req["depot"]
    local = dest / RECORD_DIR / "depot-manifest.json"
    try:
        local.unlink()
    except FileNotFoundError:
        pass
    try:
        _rsync(depot, f"{depot['path']}/{RECORD}", local)
    except Failure as exc:
        raise Failure(f"depot {depot['host']} has no verified copy of {req['repo_id']}@{req['sha']} "
                      f"(add it to depot_models and run deploys/depot.py): {exc}") from None
    doc = json.loads(local.read_text())
    if doc.get("repo_id") != req["repo_id"] or doc.get("sha") != req["sha"]:
        raise Failure(f"depot manifest is for {doc.get('repo_id')}@{doc.get('sha')}, "
                      f"expected {req['repo_id']}@{req['sha']}")
    files = {p: {"size": s, "sha256": doc["sha256"][p]} for p, s in doc["files"].items()
             if matches(p, req["include"])}
    if not files:
        raise Failure(f"no file of the depot's {req['repo_id']}@{req['sha']} matches "
                      f"include {req['include']} (the depot has {sorted(doc['files'])})")
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
    cmd = [req["hf"], "download", req["repo_id"], "--revision", req["sha"], "--local-dir", str(dest)]
    for pattern in req["include"]:
        cmd += ["--include", pattern]
    log(f"hf download {req['repo_id']}@{req['sha'][:12]} from {req['endpoint']} "
        f"(include {req['include']})")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise Failure(f"hf download failed ({proc.returncode}): {proc.stdout.strip()[-1500:]}")


def fetch_depot(req: dict, dest: Path, files: dict[str, dict]) -> None:
    depot = req["depot"]
    list_file = dest / RECORD_DIR / "depot-files.txt"
    list_file.write_text("".join(f"{p}\n" for p in sorted(files)))
    log(f"rsync {req['repo_id']}@{req['sha'][:12]} from depot {depot['host']} ({len(files)} files)")
    _rsync(depot, f"{depot['path']}/", dest, list_file=list_file, partial=True)


# -- main --------------------------------------------------------------------------------------


def run(req: dict) -> dict:
    dest = bounded_dest(req["dest"], req["root"])
    (dest / RECORD_DIR).mkdir(parents=True, exist_ok=True)
    bounded_dest(req["dest"], req["root"])  # again, now that it exists (no symlink swapped in)
    record = dest / RECORD
    try:
        record.unlink()  # from here until verified, the model is not ready
    except FileNotFoundError:
        pass

    if req["source"] == "depot":
        expected = depot_manifest(req, dest)
    else:
        expected = {f["path"]: {"size": f["size"], "sha256": f.get("sha256"), "oid": f.get("oid")}
                    for f in req["files"]}

    outside = sorted(p for p in expected if not safe_relpath(p))
    if outside:
        raise Failure(f"{req['source']} names files outside the model directory "
                      f"({', '.join(repr(p) for p in outside[:3])}); refused, nothing was fetched")
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
        problem, digest = check_file(dest / rel, expected[rel])
        if problem:
            bad.append(f"{rel}: {problem}")
            forget(dest, rel)
        else:
            sha256[rel] = digest
    if bad:
        raise Failure(f"verification of {req['repo_id']}@{req['sha'][:12]} failed; deleted, the next "
                      "run fetches again: " + "; ".join(bad))

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
    write_json_atomic(record, doc)
    total = sum(sizes.values())
    log(f"verified {len(sizes)} files ({total / 1e6:.1f} MB) of {req['repo_id']}@{req['sha'][:12]} "
        f"in {dest} (fetch {fetched:.1f} s)")
    return doc


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    req = json.loads(Path(argv[1]).read_text())
    try:
        run(req)
    except Failure as exc:
        print(f"servefleet: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
