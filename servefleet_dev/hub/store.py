"""The hub's store: `publish()` commits a directory to a repository, `HubStore` reads commits back.

Layout under the store's root:

    ROOT/{models|datasets}/{org}/{name}/refs/{branch}        commit sha of the branch (text)
    ROOT/{models|datasets}/{org}/{name}/commits/{sha}.json   manifest: path, size, oid, lfs per file
    ROOT/{models|datasets}/{org}/{name}/blobs/{etag}         file content, named by its ETag

A file's ETag is what the client checks: sha256 for LFS files, the git blob sha1 otherwise. Blobs are
content-addressed, so publishing a new commit only stores the files that changed, and a commit sha is
derived from the content alone (publishing the same directory twice gives the same sha).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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
        return {
            "path": self.path,
            "size": self.size,
            "oid": self.oid,
            "lfs_sha256": self.lfs_sha256,
        }


@dataclass(frozen=True)
class Commit:
    """A published snapshot of a repository."""

    sha: str
    files: dict[str, FileEntry]
    message: str = ""
    created_at: str = ""


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS file (its sha1 is the tree oid)."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


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


def atomic_write(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename: a reader sees the old content or the new."""
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
            "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "files": [e.to_json() for e in entries],
        }
        atomic_write(manifest, json.dumps(doc, indent=1).encode())
    # The ref moves last: a reader never sees a branch pointing at a half-written commit.
    atomic_write(rdir / "refs" / branch, sha.encode() + b"\n")
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
            if not _SHA_RE.match(sha):  # a damaged ref must not name a path outside commits/
                raise RevisionNotFound(f"ref {revision!r} of {repo_id!r} holds no commit sha")
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
        files = {
            f["path"]: FileEntry(f["path"], f["size"], f["oid"], f.get("lfs_sha256"))
            for f in doc["files"]
        }
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
