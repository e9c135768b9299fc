"""Models on the operator side: the hub's API (revision -> commit sha, file list with LFS
sha256), include patterns, and the record a verified download leaves on a node.

The node-side fetcher is files/model/fetch_model.py; servefleet.operations.models runs it.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TypeGuard
from urllib.parse import quote

from servefleet.core import deadline_http, node_output, records
from servefleet.core.errors import DataError
from servefleet.core.secrets import SECRET_RE, SecretError, read_secret

RECORD = ".servefleet/verified.json"  # inside the model directory: "complete and verified"
SIZES_MARKER = "#servefleet-sizes"  # the VerifiedModel fact's separator: record, then sizes
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# model_source's values (data): each node downloads from the hub, or copies from the fleet's
# model store (the depot node class, servefleet.fleet.nodes).
FROM_HUB, FROM_STORE = "hub", "depot"


def matches(path: str, include: list[str]) -> bool:
    """huggingface_hub's allow_patterns: fnmatch, a trailing '/' means the whole folder."""
    return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in include)


# What a node's file system takes (NAME_MAX 255 bytes a name), with room for the fetcher's
# .incomplete and .rsync-partial names beside it; and a bound on the depth and whole path.
MAX_NAME, MAX_PATH, MAX_DEPTH = 200, 1024, 16


def safe_repo_path(path: object) -> TypeGuard[str]:
    """A file path a hub or depot may name: relative, normal, no '..', no control characters,
    names and the path short enough for any node's file system."""
    return (
        isinstance(path, str)
        and path != ""
        and not path.startswith("/")
        and len(path) <= MAX_PATH
        and path.count("/") < MAX_DEPTH
        and all(part not in ("", ".", "..") and len(part) <= MAX_NAME for part in path.split("/"))
        and re.fullmatch(r"[A-Za-z0-9._/+@=-]+", path) is not None
    )


class HubError(Exception):
    """The hub did not give us the commit or its file list; the message never holds the token.
    Whatever the hub wrote in it (X-Error-Code, a URL) is escaped: no terminal escape, line
    break or bidi control reaches the operator's terminal (node_output.shown)."""

    def __init__(self, message: str):
        super().__init__(node_output.shown(str(message)))


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    oid: str  # git blob sha1 (of the LFS pointer for LFS files)
    sha256: str | None  # the LFS oid; None for small files kept in git

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "oid": self.oid, "sha256": self.sha256}


@dataclass(frozen=True)
class HubCommit:
    repo_id: str
    sha: str
    files: tuple[HubFile, ...]

    def select(self, include: list[str]) -> list[HubFile]:
        return [f for f in self.files if matches(f.path, include)]


# Bounds of the operator-side hub client: what a hostile or broken hub can make it do.
MAX_BODY = 64 * 1024**2  # one API answer (a tree page of 1000 entries is ~300 KB)
MAX_PAGES = 1000  # pages of one file list (a million files)


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect to another origin is refused: the token (and the next-page check) would not
    survive it. The token is also an unredirected header, so it never follows one."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if _origin(newurl) != _origin(req.full_url):
            raise HubError(f"the hub redirected to another origin ({newurl[:100]}); refused")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            deadline_http.set_deadline(new, deadline_http.deadline_of(req))  # redirects included
        return new


# One deadline per request covers connecting, the status line, headers and body.
_OPENER = urllib.request.build_opener(
    _SameOriginRedirects, deadline_http.HTTPHandler, deadline_http.HTTPSHandler
)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _read_bounded(resp, deadline: float, timeout: float, what: str) -> bytes:
    """The body, at most MAX_BODY bytes, all of it within the request's deadline (a hub that
    drips one byte at a time cannot hold the run: the socket timeout is per read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise HubError(f"{what}: the hub's answer took longer than {timeout:g} s; refused")
        chunk = resp.read1(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_BODY:
            raise HubError(f"{what}: the hub's answer is larger than {MAX_BODY} bytes; refused")
        chunks.append(chunk)


def _get_json(url: str, token: str | None, timeout: float, what: str):
    req = urllib.request.Request(
        url, headers={"Accept": "application/json", "User-Agent": "servefleet"}
    )
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")
    deadline = deadline_http.set_deadline(req, time.monotonic() + timeout)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            body = _read_bounded(resp, deadline, timeout, what)
            link = resp.headers.get("Link")
    except HubError as exc:
        raise HubError(str(exc) if str(exc).startswith(what) else f"{what}: {exc}") from None
    except urllib.error.HTTPError as exc:
        code = exc.headers.get("X-Error-Code") or ""
        if exc.code in (401, 403) or code in ("RepoNotFound", "GatedRepo"):
            hint = (
                "a token was sent but refused"
                if token
                else "no token was given (set HF_TOKEN or hf_token_file)"
            )
            raise HubError(
                f"{what}: the hub answered {exc.code} {code} - the repo does not exist, "
                f"or it is private/gated and {hint}"
            ) from None
        if code == "RevisionNotFound":
            raise HubError(f"{what}: revision not found on the hub") from None
        raise HubError(f"{what}: the hub answered HTTP {exc.code} {code}".rstrip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or time.monotonic() > deadline:
            raise HubError(
                f"{what}: the hub's answer took longer than {timeout:g} s; refused"
            ) from None
        raise HubError(f"{what}: cannot reach the hub: {reason}") from None
    try:
        return json.loads(body, parse_constant=_refuse_constant), link
    except RecursionError:
        raise HubError(f"{what}: the hub's answer is nested too deep; refused") from None
    except ValueError as exc:
        raise HubError(f"{what}: the hub's answer is not JSON ({str(exc)[:80]}); refused") from None


def _next_link(link: str | None) -> str | None:
    """The rel="next" URL of a Link header (the hub pages tree listings by 1000)."""
    for part in (link or "").split(","):
        m = re.match(r'\s*<([^>]+)>\s*;.*rel="?next"?', part)
        if m:
            return m.group(1)
    return None


@functools.lru_cache(maxsize=128)
def hub_commit(
    endpoint: str, repo_id: str, revision: str, token: str | None = None, timeout: float = 30
) -> HubCommit:
    """The commit `revision` designates on the hub at endpoint, with every file (cached per run)."""
    endpoint = endpoint.rstrip("/")
    what = f"{repo_id}@{revision} on {endpoint}"
    sha = revision
    if not SHA_RE.fullmatch(revision):
        doc, _ = _get_json(
            f"{endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}",
            token,
            timeout,
            what,
        )
        found = doc.get("sha") if isinstance(doc, dict) else None
        if not isinstance(found, str) or not SHA_RE.fullmatch(found):
            raise HubError(f"{what}: the hub's answer has no commit sha")
        sha = found
    out: list[HubFile] = []
    url: str | None = f"{endpoint}/api/models/{repo_id}/tree/{sha}?recursive=true"
    seen: set[str] = set()
    while url:
        if url in seen or len(seen) >= MAX_PAGES:
            raise HubError(
                f"{what}: the hub's file list pages in a loop or past {MAX_PAGES} pages; refused"
            )
        seen.add(url)
        entries, link = _get_json(url, token, timeout, what)
        if not isinstance(entries, list):
            raise HubError(f"{what}: the hub's file list is not a list")
        for e in entries:
            if not isinstance(e, dict) or e.get("type") != "file":
                continue
            out.append(_hub_file(e, what))
        url = _next_link(link)
        if url and not url.startswith(endpoint + "/"):
            raise HubError(f"{what}: the hub's next page {url[:100]!r} is not on {endpoint}")
    return HubCommit(repo_id=repo_id, sha=sha, files=tuple(sorted(out, key=lambda f: f.path)))


def _hub_file(entry: dict, what: str) -> HubFile:
    """One tree entry, refused unless its path stays inside the model directory and its size
    and hashes are well-formed (a hostile hub cannot name ../../etc/passwd)."""
    path, size = entry.get("path"), entry.get("size")
    if not safe_repo_path(path):
        raise HubError(
            f"{what}: the hub lists a file path {str(path)[:100]!r} that is not a "
            f"plain relative path; refused"
        )
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise HubError(f"{what}: the hub lists {path} with size {size!r}; refused")
    lfs = entry.get("lfs")
    if not isinstance(lfs, dict):
        lfs = {}
    sha256 = lfs.get("oid") or lfs.get("sha256")
    oid = entry.get("oid", "")
    if sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha256)):
        raise HubError(f"{what}: the hub lists {path} with sha256 {str(sha256)[:80]!r}; refused")
    if oid and not re.fullmatch(r"[0-9a-f]{40}", str(oid)):
        raise HubError(f"{what}: the hub lists {path} with oid {str(oid)[:80]!r}; refused")
    return HubFile(path=path, size=size, oid=oid, sha256=sha256)


def operator_token(data, host_name: str) -> str | None:
    """The hub token: the file hf_token_file names (operator side), else $HF_TOKEN, else None."""
    path = data.get("hf_token_file")
    if path:
        try:
            return read_secret(path)
        except SecretError as exc:
            raise DataError(
                f"invalid data for host {host_name}: key 'hf_token_file': {exc}; "
                f"nothing was changed"
            ) from None
    token = os.environ.get("HF_TOKEN")
    if token and not SECRET_RE.fullmatch(token):
        raise DataError(
            f"invalid $HF_TOKEN for host {host_name}: expected one line of "
            f"URL-safe characters; nothing was changed"
        )
    return token or None


def parse_verified(lines: list[str]) -> dict | None:
    """The record a verified download left, if every recorded file is on disk at its size and
    nothing else is there (an unlisted file next to a verified model is drift: a planted
    `*.safetensors` or `*.py` would be loaded with it)."""
    record, on_disk = split_record(lines)
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return None
    if any(on_disk.get(p) != s for p, s in record["files"].items()):
        return None
    if set(on_disk) - set(record["files"]):
        return None
    return record


def split_record(lines: list[str]) -> tuple[dict | None, dict[str, int]]:
    """(record or None, {path: size on disk}) from the VerifiedModel fact's output."""
    if SIZES_MARKER not in lines:
        return None, {}
    cut = lines.index(SIZES_MARKER)
    try:  # strict and bounded (a deep record would end in a RecursionError): else unverified
        text = node_output.decode(lines[:cut], "the verified-model record").decode("utf-8")
        record = records.load(text, "the verified-model record")
    except (node_output.NodeOutputError, UnicodeDecodeError, records.RecordError):
        record = None
    try:  # names as bytes (base64, NUL between): a newline or a non-UTF-8 byte is a name's
        raw = node_output.decode(lines[cut + 1 :], "the model directory's listing")
        on_disk = (
            node_output.sized_names(raw)
            if len(raw) <= node_output.MAX_LISTING
            else {LISTING_UNREADABLE: -1}
        )
    except node_output.NodeOutputError:
        on_disk = {LISTING_UNREADABLE: -1}  # never verified: nothing is known of the files
    return (record if isinstance(record, dict) else None), on_disk


# What stands for the files when the listing could not be read (cut short, too long): a name
# no file has, so the record never verifies, and the reason says why.
LISTING_UNREADABLE = "(the directory's listing could not be read in full)"


def satisfies(record: dict | None, repo_id: str, sha: str, include: list[str]) -> bool:
    """Does a verified record already hold repo_id at sha with these include patterns?"""
    if not record:
        return False
    return (
        record.get("repo_id") == repo_id
        and record.get("sha") == sha
        and sorted(record.get("include") or []) == sorted(include)
    )


def invalid_record_reason(record: dict | None, on_disk: dict[str, int]) -> str:
    """Why there is no valid record: none, or files missing / resized."""
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return "no record that the model was verified"
    missing = sorted(p for p in record["files"] if p not in on_disk)
    resized = sorted(p for p, s in record["files"].items() if p in on_disk and on_disk[p] != s)
    unlisted = sorted(set(on_disk) - set(record["files"]))
    parts = []
    if LISTING_UNREADABLE in on_disk:
        return LISTING_UNREADABLE
    shown = node_output.shown
    if missing:
        parts.append("missing: " + ", ".join(map(shown, missing)))
    if resized:
        parts.append("size changed: " + ", ".join(map(shown, resized)))
    if unlisted:
        parts.append(
            "not part of the model: "
            + ", ".join(map(shown, unlisted[:10]))
            + (f" (+{len(unlisted) - 10} more)" if len(unlisted) > 10 else "")
        )
    return "; ".join(parts) or "record unreadable"
