"""A local server speaking the Hugging Face hub's file API, for tests, the testbed and benchmarks.

huggingface.co is not reachable from our machines, so this serves model repos from a directory with
the subset of the hub's HTTP contract that the real `huggingface_hub` client (`hf_hub_download`,
`snapshot_download`, `hf download`, `hf cache verify`) needs when pointed at it with HF_ENDPOINT.

Storage (`root`), all written by `publish()`:

    ROOT/{models|datasets}/{org}/{name}/refs/{branch}        commit sha of the branch (text)
    ROOT/{models|datasets}/{org}/{name}/commits/{sha}.json   manifest: path, size, oid, lfs per file
    ROOT/{models|datasets}/{org}/{name}/blobs/{etag}         file content, named by its ETag

A file's ETag is what the client checks: sha256 for LFS files, the git blob sha1 otherwise. Blobs are
content-addressed, so publishing a new commit only stores the files that changed, and a commit sha is
derived from the content alone (publishing the same directory twice gives the same sha).

HTTP endpoints (rev is URL-quoted, e.g. refs%2Fpr%2F1):

    HEAD/GET /{repo}/resolve/{rev}/{path}      file (Range: bytes=N-[M] -> 206), X-Repo-Commit, ETag
    GET /api/models/{repo}[/revision/{rev}]    {"id", "sha", "siblings": [...]}
    GET /api/models/{repo}/tree/{rev}[/{dir}]  [{"type", "path", "size", "oid", "lfs"}] (?recursive=true)
    GET /api/models/{repo}/refs                {"branches": [...], "tags": [], ...}
    (/datasets/{repo}/resolve/... and /api/datasets/... likewise)

    GET  /_servefleet/health                   {"ok": true}
    GET  /_servefleet/stats                    body bytes served: total, per repo, per file
    POST /_servefleet/stats/reset
    GET/POST/DELETE /_servefleet/faults        per-file throttle / mid-body disconnect, for tests

Errors carry the `X-Error-Code` the client maps to its exceptions: RepoNotFound (404, or 401 when a
token is configured and the request lacks it), RevisionNotFound (404), EntryNotFound (404, with
X-Repo-Commit). The /_servefleet/ endpoints are operator endpoints and do not require the token: the
server only binds to loopback or the testbed's own bridge address, never a wildcard.

File bodies go out with os.sendfile in bounded chunks: a 1 GB file never costs 1 GB of RAM.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import hmac
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import socket
import socketserver
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, unquote, urlsplit

# Files above this size are LFS files (sha256 ETag), like the hub's default for `git push`.
LFS_THRESHOLD = 10 * 1024 * 1024
# Extensions the hub's default .gitattributes routes to LFS whatever their size.
LFS_EXTENSIONS = frozenset(
    ".safetensors .gguf .bin .pt .pth .ckpt .h5 .onnx .msgpack .npy .npz .pkl .pickle .model "
    ".tflite .ot .arrow .parquet .tar .tgz .gz .zip .zst .xz .7z".split()
)
REPO_TYPES = ("model", "dataset")
# Never published: VCS data and the metadata `hf download --local-dir` keeps beside the files.
_SKIP_DIRS = (".git", ".cache/huggingface")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_HASH_CHUNK = 8 * 1024 * 1024
_SEND_CHUNK = 8 * 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Storage: publish and look up commits
# --------------------------------------------------------------------------------------------------


class RepoNotFound(LookupError):
    """No such repository in the store."""


class RevisionNotFound(LookupError):
    """The repository exists, the branch or commit does not."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a commit, as the tree API and the resolve headers describe it."""

    path: str
    size: int
    oid: str  # git blob sha1 (of the LFS pointer for LFS files), the tree API's "oid"
    lfs_sha256: str | None = None

    @property
    def etag(self) -> str:
        """What the client stores the blob under and `hf cache verify` checks."""
        return self.lfs_sha256 or self.oid

    def pointer(self) -> bytes:
        return lfs_pointer(self.lfs_sha256, self.size) if self.lfs_sha256 else b""

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "oid": self.oid, "lfs_sha256": self.lfs_sha256}


@dataclass(frozen=True)
class Commit:
    """A published snapshot of a repository."""

    sha: str
    files: dict[str, FileEntry]
    message: str = ""
    created_at: str = ""


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS file (its sha1 is the tree oid)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _hash_file(path: Path, size: int, lfs: bool) -> str:
    """sha256 (LFS) or git blob sha1 of a file, read in chunks: files may be many GB."""
    digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_lfs(path: str, size: int, threshold: int = LFS_THRESHOLD) -> bool:
    """LFS classification: large files and model-weight extensions."""
    return size > threshold or Path(path).suffix.lower() in LFS_EXTENSIONS


def _validate_repo_id(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME_RE.match(p) and ".." not in p for p in parts):
        raise ValueError(f"invalid repo id {repo_id!r}: expected ORG/NAME")
    return parts[0], parts[1]


def _validate_branch(branch: str) -> str:
    parts = branch.split("/")
    if not branch or any(p in ("", ".", "..") or "\0" in p for p in parts) or _SHA_RE.match(branch):
        raise ValueError(f"invalid branch name {branch!r}")
    return branch


def repo_dir(root: str | os.PathLike, repo_id: str, repo_type: str = "model") -> Path:
    """Directory of a repository in the store (validates the id: it becomes a path)."""
    if repo_type not in REPO_TYPES:
        raise ValueError(f"invalid repo type {repo_type!r}: expected one of {REPO_TYPES}")
    org, name = _validate_repo_id(repo_id)
    return Path(root) / f"{repo_type}s" / org / name


def _walk_files(src: Path) -> Iterator[tuple[str, Path]]:
    """(repo path, file) for every regular file under src; follows symlinks (HF cache snapshots)."""
    for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
        rel_dir = Path(dirpath).relative_to(src).as_posix()
        dirnames[:] = sorted(
            d for d in dirnames if (d if rel_dir == "." else f"{rel_dir}/{d}") not in _SKIP_DIRS
        )
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file():
                yield (name if rel_dir == "." else f"{rel_dir}/{name}"), path


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _store_blob(src: Path, dest: Path, link: bool) -> None:
    """Put src at dest (content-addressed: an existing dest already has this content)."""
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}-{threading.get_ident()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        if link:
            try:
                os.link(src, tmp)
            except OSError:  # other filesystem, or links not allowed: copy instead
                shutil.copyfile(src, tmp)
        else:
            shutil.copyfile(src, tmp)  # in-kernel copy on Linux, never the whole file in RAM
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def publish(
    root: str | os.PathLike,
    repo_id: str,
    src_dir: str | os.PathLike,
    branch: str = "main",
    message: str | None = None,
    *,
    repo_type: str = "model",
    link: bool = False,
    lfs_threshold: int = LFS_THRESHOLD,
) -> str:
    """Commit the files of src_dir to repo_id at branch in the store at root; return the commit sha.

    The sha is a sha1 over the sorted (path, size, oid, sha256) list, so it depends on the content
    only: republishing an unchanged directory is a no-op that returns the same sha. `link=True`
    hard-links files into the store instead of copying (fast for big files; the source must then
    never be modified in place, or the store changes with it).
    """
    src = Path(src_dir)
    if not src.is_dir():
        raise NotADirectoryError(f"not a directory: {src}")
    _validate_branch(branch)
    rdir = repo_dir(root, repo_id, repo_type)
    entries: list[FileEntry] = []
    for rel, path in _walk_files(src):
        size = path.stat().st_size
        if is_lfs(rel, size, lfs_threshold):
            sha256 = _hash_file(path, size, lfs=True)
            entry = FileEntry(rel, size, git_blob_sha1(lfs_pointer(sha256, size)), sha256)
        else:
            entry = FileEntry(rel, size, _hash_file(path, size, lfs=False))
        _store_blob(path, rdir / "blobs" / entry.etag, link)
        entries.append(entry)
    entries.sort(key=lambda e: e.path)
    content = json.dumps([[e.path, e.size, e.oid, e.lfs_sha256] for e in entries]).encode()
    sha = hashlib.sha1(content).hexdigest()
    manifest = rdir / "commits" / f"{sha}.json"
    if not manifest.exists():  # commits are immutable: the first message wins
        doc = {
            "sha": sha,
            "repo_id": repo_id,
            "repo_type": repo_type,
            "message": message or f"publish {src.name}",
            "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "files": [e.to_json() for e in entries],
        }
        _atomic_write(manifest, json.dumps(doc, indent=1).encode())
    # The ref moves last: a reader never sees a branch pointing at a half-written commit.
    _atomic_write(rdir / "refs" / branch, sha.encode() + b"\n")
    return sha


class HubStore:
    """Read side of the store: resolves revisions and caches (immutable) manifests."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._manifests: dict[Path, Commit] = {}
        self._lock = threading.Lock()

    def repo(self, repo_type: str, repo_id: str) -> Path:
        try:
            rdir = repo_dir(self.root, repo_id, repo_type)
        except ValueError as exc:
            raise RepoNotFound(str(exc)) from None
        if not (rdir / "refs").is_dir():
            raise RepoNotFound(f"repository {repo_id!r} not found")
        return rdir

    def resolve(self, repo_type: str, repo_id: str, revision: str) -> Commit:
        """The commit a branch name or 40-hex sha designates."""
        rdir = self.repo(repo_type, repo_id)
        sha = revision
        if not _SHA_RE.match(revision):
            try:
                ref = rdir / "refs" / _validate_branch(revision)
                sha = ref.read_text().strip()
            except (ValueError, OSError):
                raise RevisionNotFound(f"revision {revision!r} not found in {repo_id!r}") from None
        return self._load(rdir / "commits" / f"{sha}.json", repo_id, revision)

    def _load(self, manifest: Path, repo_id: str, revision: str) -> Commit:
        with self._lock:
            commit = self._manifests.get(manifest)
        if commit is not None:
            return commit
        try:
            doc = json.loads(manifest.read_text())
        except FileNotFoundError:
            raise RevisionNotFound(f"revision {revision!r} not found in {repo_id!r}") from None
        files = {f["path"]: FileEntry(f["path"], f["size"], f["oid"], f.get("lfs_sha256")) for f in doc["files"]}
        commit = Commit(doc["sha"], files, doc.get("message", ""), doc.get("created_at", ""))
        with self._lock:
            if len(self._manifests) > 256:
                self._manifests.clear()
            self._manifests[manifest] = commit
        return commit

    def branches(self, repo_type: str, repo_id: str) -> dict[str, str]:
        refs = self.repo(repo_type, repo_id) / "refs"
        return {
            p.relative_to(refs).as_posix(): p.read_text().strip()
            for p in sorted(refs.rglob("*"))
            if p.is_file() and not p.name.startswith(".tmp-")
        }

    def blob(self, repo_type: str, repo_id: str, entry: FileEntry) -> Path:
        return self.repo(repo_type, repo_id) / "blobs" / entry.etag


# --------------------------------------------------------------------------------------------------
# Byte counters and fault injection
# --------------------------------------------------------------------------------------------------


class Stats:
    """Body bytes served: what a benchmark reports as "upstream bytes"."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.total_bytes = 0
            self.api_bytes = 0
            self.requests = {"resolve_head": 0, "resolve_get": 0, "api": 0, "errors": 0}
            self.repos: dict[str, int] = {}
            self.files: dict[str, dict[str, int]] = {}

    def count_request(self, kind: str, file_key: str | None = None, ranged: bool = False) -> None:
        with self._lock:
            self.requests[kind] += 1
            if file_key is not None:
                f = self.files.setdefault(file_key, {"bytes": 0, "gets": 0, "range_gets": 0})
                f["gets"] += 1
                f["range_gets"] += int(ranged)

    def add_bytes(self, repo_key: str, file_key: str, n: int) -> None:
        with self._lock:
            self.total_bytes += n
            self.repos[repo_key] = self.repos.get(repo_key, 0) + n
            self.files[file_key]["bytes"] += n

    def add_api_bytes(self, n: int) -> None:
        with self._lock:
            self.api_bytes += n

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "total_bytes": self.total_bytes,
                "api_bytes": self.api_bytes,
                "requests": dict(self.requests),
                "repos": dict(self.repos),
                "files": {k: dict(v) for k, v in self.files.items()},
            }


@dataclass
class FaultRule:
    """Applies to GETs of files whose "org/name/path" matches pattern (fnmatch).

    bytes_per_second throttles the body (read live, so clearing the rule speeds up a transfer in
    flight); drop_after closes the connection after that many body bytes of a response, which the
    client sees as a broken transfer; times limits how many responses the rule affects.
    """

    pattern: str = "*"
    bytes_per_second: int | None = None
    drop_after: int | None = None
    times: int | None = None
    active: bool = field(default=True, compare=False)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("pattern", "bytes_per_second", "drop_after", "times")}


class Faults:
    def __init__(self):
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def set(self, rule: FaultRule) -> None:
        """Add a rule, replacing any with the same pattern."""
        with self._lock:
            for old in self._rules:
                if old.pattern == rule.pattern:
                    old.active = False
            self._rules = [r for r in self._rules if r.active] + [rule]

    def clear(self) -> None:
        with self._lock:
            for rule in self._rules:
                rule.active = False
            self._rules = []

    def begin(self, file_key: str) -> FaultRule | None:
        """The rule governing one response (the newest match), counting it against `times`."""
        with self._lock:
            for rule in reversed(self._rules):
                if rule.active and fnmatch.fnmatchcase(file_key, rule.pattern):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            rule.active = False
                            self._rules.remove(rule)
                    return rule
        return None

    def to_json(self) -> list[dict]:
        with self._lock:
            return [r.to_json() for r in self._rules]


@dataclass
class HubState:
    """What every listening socket of one hub process shares."""

    store: HubStore
    token: str | None = None
    verbose: bool = False
    stats: Stats = field(default_factory=Stats)
    faults: Faults = field(default_factory=Faults)


# --------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single `bytes=` range; None = whole file (or a multi-range)."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[6:].strip().partition("-")
    try:
        if first == "":  # suffix range: the last N bytes
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
    except ValueError:
        return None
    if start >= size or start > end:
        raise _HTTPError(416, "range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, min(end, size - 1)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools connections
    server_version = "servefleet-hub/1"
    timeout = 120  # idle keep-alive connections give their thread back after this
    server: "HubHTTPServer"

    # -- plumbing ----------------------------------------------------------------------------------

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        if self.server.hub.verbose:
            super().log_message(format, *args)

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self._headers_sent = False
        hub = self.server.hub
        url = urlsplit(self.path)
        segs = url.path.split("/")[1:]  # still quoted: a quoted rev may contain %2F
        try:
            body = self._read_body()
            if segs[:1] == ["_servefleet"]:
                return self._control(method, segs[1:], body)
            self._check_token()
            if segs[:1] == ["api"]:
                if method != "GET":
                    raise _HTTPError(405, "method not allowed")
                return self._api(segs[1:], parse_qs(url.query))
            if method not in ("GET", "HEAD"):
                raise _HTTPError(405, "method not allowed")
            return self._resolve(method, segs)
        except _HTTPError as exc:
            hub.stats.count_request("errors")
            self._send_json(exc.status, {"error": str(exc)}, method, exc.code, exc.headers)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client went away; nothing to answer
        except Exception:  # a bug or a broken store: say so, and keep serving other requests
            self.close_connection = True
            print(f"servefleet hub: internal error on {method} {self.path}", file=sys.stderr)
            traceback.print_exc()
            if not self._headers_sent:
                self._send_json(500, {"error": "internal server error"}, method)

    def end_headers(self):
        self._headers_sent = True
        super().end_headers()

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 1 << 16:
            raise _HTTPError(413, "request body too large")
        return self.rfile.read(length) if length else b""

    def _check_token(self) -> None:
        token = self.server.hub.token
        if token is None:
            return
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            # What the hub answers for a private repo without credentials: the client raises
            # RepositoryNotFoundError.
            raise _HTTPError(401, "Invalid username or password.", "RepoNotFound")

    def _send_json(self, status, doc, method="GET", code=None, headers=None, count=True) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code:
            self.send_header("X-Error-Code", code)
            # json-escaped: a path from the URL may hold non-latin-1 characters or a newline.
            self.send_header("X-Error-Message", json.dumps(str(doc.get("error", "")))[1:-1])
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)
            if count:
                self.server.hub.stats.add_api_bytes(len(data))

    # -- hub endpoints ---------------------------------------------------------------------------

    @staticmethod
    def _repo_type(segs: list[str]) -> tuple[str, list[str]]:
        if segs and segs[0] == "datasets":
            return "dataset", segs[1:]
        return "model", segs

    def _lookup(self, repo_type: str, repo_id: str, rev: str) -> Commit:
        try:
            return self.server.hub.store.resolve(repo_type, repo_id, rev)
        except RepoNotFound as exc:
            raise _HTTPError(404, str(exc), "RepoNotFound") from None
        except RevisionNotFound as exc:
            raise _HTTPError(404, str(exc), "RevisionNotFound") from None

    def _resolve(self, method: str, segs: list[str]) -> None:
        repo_type, segs = self._repo_type(segs)
        if len(segs) < 5 or segs[2] != "resolve" or not segs[4]:
            raise _HTTPError(404, "not found")
        repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
        commit = self._lookup(repo_type, repo_id, unquote(segs[3]))
        path = unquote("/".join(segs[4:]))
        entry = commit.files.get(path)
        if entry is None:
            raise _HTTPError(404, f"{path!r} not found at {commit.sha}", "EntryNotFound", {"X-Repo-Commit": commit.sha})
        hub = self.server.hub
        blob = hub.store.blob(repo_type, repo_id, entry)
        rng = _parse_range(self.headers.get("Range"), entry.size)
        start, end = rng or (0, entry.size - 1)
        repo_key = repo_id if repo_type == "model" else f"datasets/{repo_id}"
        file_key = f"{repo_key}/{path}"
        if method == "HEAD":
            hub.stats.count_request("resolve_head")
        else:
            hub.stats.count_request("resolve_get", file_key, ranged=rng is not None)

        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{entry.etag}"')
        self.send_header("X-Repo-Commit", commit.sha)
        if entry.lfs_sha256:  # the hub's headers for LFS files (it redirects them to a CDN)
            self.send_header("X-Linked-Etag", f'"{entry.lfs_sha256}"')
            self.send_header("X-Linked-Size", str(entry.size))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{entry.size}")
        self.end_headers()
        if method == "GET" and end >= start:
            self._send_file(blob, start, end - start + 1, repo_key, file_key, hub.faults.begin(file_key))

    def _send_file(self, blob: Path, offset: int, length: int, repo_key: str, file_key: str, rule) -> None:
        """sendfile() the byte range in bounded chunks, counting each, honouring fault rules."""
        stats = self.server.hub.stats
        sock = self.connection
        sent = 0
        with open(blob, "rb") as f:
            while sent < length:
                chunk = min(length - sent, _SEND_CHUNK)
                rate = rule.bytes_per_second if rule is not None and rule.active else None
                if rate:
                    chunk = min(chunk, max(1, rate // 10))  # ~10 sends a second keeps the rate smooth
                if rule is not None and rule.drop_after is not None:
                    chunk = min(chunk, rule.drop_after - sent)
                    if chunk <= 0:
                        self.close_connection = True  # body cut short: the client sees a broken transfer
                        return
                began = time.monotonic()
                n = _sendfile(sock, f.fileno(), offset + sent, chunk)
                if n == 0:  # blob shorter than its manifest says: cut, don't hang the client
                    self.close_connection = True
                    return
                sent += n
                stats.add_bytes(repo_key, file_key, n)
                if rate:
                    time.sleep(max(0.0, n / rate - (time.monotonic() - began)))

    def _api(self, segs: list[str], query: dict) -> None:
        # /api/{models|datasets}/{org}/{name}[/revision/{rev} | /tree/{rev}[/{dir}] | /refs]
        if len(segs) < 3 or segs[0] not in ("models", "datasets"):
            raise _HTTPError(404, "not found")
        repo_type = segs[0][:-1]
        repo_id = f"{unquote(segs[1])}/{unquote(segs[2])}"
        rest = segs[3:]
        hub = self.server.hub
        hub.stats.count_request("api")
        if not rest or (rest[0] == "revision" and len(rest) == 2):
            commit = self._lookup(repo_type, repo_id, unquote(rest[1]) if rest else "main")
            return self._send_json(200, _repo_info(repo_id, commit))
        if rest[0] == "tree" and len(rest) >= 2:
            commit = self._lookup(repo_type, repo_id, unquote(rest[1]))
            prefix = unquote("/".join(rest[2:])).strip("/")
            flag = lambda name: query.get(name, ["false"])[0].lower() in ("1", "true")  # noqa: E731
            entries = _tree(commit, prefix, flag("recursive"), flag("expand"))
            if entries is None:
                raise _HTTPError(404, f"{prefix!r} not found", "EntryNotFound", {"X-Repo-Commit": commit.sha})
            return self._send_json(200, entries)
        if rest == ["refs"]:
            try:
                branches = hub.store.branches(repo_type, repo_id)
            except RepoNotFound as exc:
                raise _HTTPError(404, str(exc), "RepoNotFound") from None
            refs = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": s} for b, s in branches.items()]
            return self._send_json(200, {"branches": refs, "converts": [], "tags": [], "pullRequests": []})
        raise _HTTPError(404, "not found")

    # -- operator endpoints ------------------------------------------------------------------------

    def _control(self, method: str, segs: list[str], body: bytes) -> None:
        hub = self.server.hub
        route = (method, "/".join(segs))
        if route == ("GET", "health"):
            return self._send_json(200, {"ok": True, "root": str(hub.store.root)}, count=False)
        if route == ("GET", "stats"):
            return self._send_json(200, hub.stats.snapshot(), count=False)
        if route == ("POST", "stats/reset"):
            hub.stats.reset()
            return self._send_json(200, hub.stats.snapshot(), count=False)
        if route == ("GET", "faults"):
            return self._send_json(200, hub.faults.to_json(), count=False)
        if route == ("DELETE", "faults"):
            hub.faults.clear()
            return self._send_json(200, [], count=False)
        if route == ("POST", "faults"):
            try:
                doc = json.loads(body or b"{}")
                rule = FaultRule(
                    pattern=str(doc.get("pattern") or "*"),
                    bytes_per_second=_opt_int(doc.get("bytes_per_second")),
                    drop_after=_opt_int(doc.get("drop_after")),
                    times=_opt_int(doc.get("times")),
                )
            except (ValueError, TypeError, AttributeError) as exc:
                raise _HTTPError(400, f"bad fault rule: {exc}") from None
            hub.faults.set(rule)
            return self._send_json(200, hub.faults.to_json(), count=False)
        raise _HTTPError(404, "not found")


def _opt_int(value) -> int | None:
    if value is None:
        return None
    value = int(value)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _sendfile(sock: socket.socket, fd: int, offset: int, count: int) -> int:
    """One os.sendfile on a socket that has a timeout (so is non-blocking underneath)."""
    while True:
        try:
            return os.sendfile(sock.fileno(), fd, offset, count)
        except BlockingIOError:
            timeout = sock.gettimeout()
            _, writable, _ = select.select([], [sock], [], timeout)
            if not writable:
                raise TimeoutError("client stopped reading") from None


def _repo_info(repo_id: str, commit: Commit) -> dict:
    siblings = []
    for e in commit.files.values():
        sib = {"rfilename": e.path, "size": e.size, "blobId": e.oid}
        if e.lfs_sha256:
            sib["lfs"] = {"sha256": e.lfs_sha256, "size": e.size, "pointerSize": len(e.pointer())}
        siblings.append(sib)
    return {
        "_id": commit.sha[:24],
        "id": repo_id,
        "modelId": repo_id,
        "author": repo_id.split("/")[0],
        "sha": commit.sha,
        "lastModified": commit.created_at,
        "createdAt": commit.created_at,
        "private": False,
        "disabled": False,
        "gated": False,
        "tags": [],
        "siblings": siblings,
    }


def _tree(commit: Commit, prefix: str, recursive: bool, expand: bool) -> list[dict] | None:
    """Entries of the tree API under prefix ("" = root); None when prefix is no directory.

    All entries come in one page: the hub pages by 1000 with a Link header, our repos are small.
    """
    base = f"{prefix}/" if prefix else ""
    files, dirs = [], set()
    for e in commit.files.values():
        if not e.path.startswith(base):
            continue
        parts = e.path[len(base):].split("/")
        # Every directory between prefix and the file (only the first level when not recursive).
        for depth in range(1, len(parts) if recursive else min(2, len(parts))):
            dirs.add(base + "/".join(parts[:depth]))
        if recursive or len(parts) == 1:
            files.append(e)
    if prefix and not files and not dirs:
        return None
    last_commit = {"id": commit.sha, "title": commit.message, "date": commit.created_at}
    out = []
    for d in sorted(dirs):
        entry = {"type": "directory", "oid": hashlib.sha1(f"{commit.sha}:{d}".encode()).hexdigest(), "path": d}
        out.append(entry | ({"lastCommit": last_commit} if expand else {}))
    for e in sorted(files, key=lambda e: e.path):
        entry = {"type": "file", "oid": e.oid, "size": e.size, "path": e.path}
        if e.lfs_sha256:
            entry["lfs"] = {"oid": e.lfs_sha256, "size": e.size, "pointerSize": len(e.pointer())}
        out.append(entry | ({"lastCommit": last_commit} if expand else {}))
    return out


class HubHTTPServer(ThreadingHTTPServer):
    """One listening socket; several can share one HubState (e.g. bridge address + loopback)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a fleet's worth of clients connecting at once; the default is 5

    def __init__(self, hub: HubState, host: str, port: int):
        self.hub = hub
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)

    def server_bind(self):
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn), which stalls without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[0], self.server_address[1]

    @property
    def url(self) -> str:
        return format_url(self.server_address[0], self.server_address[1])

    def process_request(self, request, client_address):
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def server_close(self):
        """Stop listening and wake the threads idling on keep-alive connections."""
        super().server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


# --------------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------------


class AddressError(OSError):
    """The address is a wildcard, not on this machine, or its port is taken."""


def format_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_address(host: str, port: int) -> None:
    """Refuse wildcard addresses and ports someone already listens on (never take them over)."""
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        raise AddressError(errno.EINVAL, f"{host!r}: give an IP address (loopback or bridge)") from None
    if wildcard:
        raise AddressError(errno.EINVAL, f"refusing wildcard address {host!r}: bind loopback or the bridge")
    if port:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(1)
            if probe.connect_ex((host, port)) == 0:
                raise AddressError(errno.EADDRINUSE, f"{format_url(host, port)} is already in use")


def make_server(hub: HubState, host: str, port: int) -> HubHTTPServer:
    """Bind (after check_address) without serving yet; raises AddressError with a clear message."""
    check_address(host, port)
    try:
        return HubHTTPServer(hub, host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AddressError(exc.errno, f"{format_url(host, port)} is already in use") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise AddressError(exc.errno, f"{host} is not an address of this machine") from None
        raise


@contextlib.contextmanager
def running_hub(
    root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, token: str | None = None
) -> Iterator[str]:
    """Serve root in a background thread for the duration of the block; yields the base URL.

    Use the URL as HF_ENDPOINT (or the client's endpoint=); hub_stats()/set_fault() talk to it.
    """
    server = make_server(HubState(HubStore(root), token=token), host, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def serve(
    root: str | os.PathLike,
    hosts: list[str] | tuple[str, ...] = ("127.0.0.1",),
    port: int = 0,
    *,
    token: str | None = None,
    pidfile: str | os.PathLike | None = None,
    ready_file: str | os.PathLike | None = None,
    verbose: bool = False,
) -> int:
    """Serve root on each host (same port) until SIGTERM/SIGINT; for `hub serve` and supervisors.

    Prints one "listening on URL" line per address once all are bound, then writes ready_file (the
    URLs, one a line) so a supervisor can wait for it. With port 0 the first address picks the port.
    """
    hub = HubState(HubStore(root), token=token, verbose=verbose)
    servers: list[HubHTTPServer] = []
    try:
        for host in hosts:
            servers.append(make_server(hub, host, port or (servers[0].server_address[1] if servers else 0)))
    except AddressError as exc:
        for server in servers:
            server.server_close()
        print(f"servefleet hub: {exc.strerror}", file=sys.stderr)
        return 1

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    if pidfile:
        _atomic_write(Path(pidfile), f"{os.getpid()}\n".encode())
    for server in servers:
        print(f"servefleet hub: serving {root} on {server.url}", flush=True)
    if ready_file:
        _atomic_write(Path(ready_file), "".join(f"{s.url}\n" for s in servers).encode())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        for path in (pidfile, ready_file):
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    return 0


# --------------------------------------------------------------------------------------------------
# Client helpers for the operator endpoints (tests, benchmarks, the testbed)
# --------------------------------------------------------------------------------------------------


def _control_call(url: str, method: str, route: str, doc=None):
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(f"{url.rstrip('/')}/_servefleet/{route}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def hub_stats(url: str, reset: bool = False) -> dict:
    """The server's byte counters ({"total_bytes", "repos", "files", ...}); reset=True zeroes them."""
    return _control_call(url, "POST", "stats/reset", {}) if reset else _control_call(url, "GET", "stats")


def set_fault(
    url: str,
    pattern: str = "*",
    *,
    bytes_per_second: int | None = None,
    drop_after: int | None = None,
    times: int | None = None,
) -> list[dict]:
    """Throttle and/or cut GETs of files matching "org/name/path" pattern; returns the rules."""
    rule = {"pattern": pattern, "bytes_per_second": bytes_per_second, "drop_after": drop_after, "times": times}
    return _control_call(url, "POST", "faults", rule)


def clear_faults(url: str) -> None:
    _control_call(url, "DELETE", "faults")


def wait_ready(url: str, timeout: float = 10.0) -> None:
    """Block until the hub at url answers its health check."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _control_call(url, "GET", "health")
            return
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """`python -m servefleet.hub serve|publish|stats|fault ...` (same as `servefleet hub ...`)."""
    import argparse

    from servefleet.commands import hub as hub_command

    parser = argparse.ArgumentParser(prog="python -m servefleet.hub", description=__doc__.split("\n")[0])
    hub_command.add_subcommands(parser)
    args = parser.parse_args(argv)
    return hub_command.run(args)


if __name__ == "__main__":
    sys.exit(main())
