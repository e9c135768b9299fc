"""The JSON documents of the hub's /api/ endpoints, built from a commit."""

from __future__ import annotations

import hashlib

from servefleet_dev.hub.store import Commit


def repo_info(repo_id: str, commit: Commit) -> dict:
    """GET /api/models/{repo}[/revision/{rev}]: the commit and its files ("siblings")."""
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


def tree(commit: Commit, prefix: str, recursive: bool, expand: bool) -> list[dict] | None:
    """Entries of the tree API under prefix ("" = root); None when prefix is no directory.

    All entries come in one page: the hub pages by 1000 with a Link header, our repos are small.
    """
    base = f"{prefix}/" if prefix else ""
    files, dirs = [], set()
    for e in commit.files.values():
        if not e.path.startswith(base):
            continue
        parts = e.path[len(base) :].split("/")
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
        entry = {
            "type": "directory",
            "oid": hashlib.sha1(f"{commit.sha}:{d}".encode()).hexdigest(),
            "path": d,
        }
        out.append(entry | ({"lastCommit": last_commit} if expand else {}))
    for e in sorted(files, key=lambda e: e.path):
        entry = {"type": "file", "oid": e.oid, "size": e.size, "path": e.path}
        if e.lfs_sha256:
            entry["lfs"] = {"oid": e.lfs_sha256, "size": e.size, "pointerSize": len(e.pointer())}
        out.append(entry | ({"lastCommit": last_commit} if expand else {}))
    return out
