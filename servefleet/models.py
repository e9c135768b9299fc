"""Models on nodes: pinned, verified downloads (hub) or copies from the fleet's depot.

The recipes call one deploy::

    run = models.ensure_model(repo_id="Qwen/Qwen-AgentWorld-35B-A3B", revision="main",
                              include=["*.json", "*.safetensors"], dest=f"{root}/models/agentworld")
    ...  # later, e.g. a restart: _if=run.changed

and read what a node holds with the fact ``VerifiedModel(path=dest)``.

How it works:

- The operator side resolves the revision to a commit sha and lists its files (sizes, LFS sha256)
  with the hub's API (``hub_commit``; one request per repo per run, none when the revision is a
  pinned sha and the node already has it). ``model_source = "depot"`` nodes ask the depot instead.
- On the node, ``files/model/fetch_model.py`` (run as the service user with the tools venv's
  python) checks free disk, fetches (``hf download --local-dir`` from ``hf_endpoint``, or rsync
  from the depot), verifies size + sha256 of every file and only then writes
  ``{dest}/.servefleet/verified.json``. A rerun decides "nothing to do" from that record (repo,
  commit sha, include patterns; file sizes on disk), without hashing anything.
- The hub token comes from ``hf_token_file`` or the operator's ``$HF_TOKEN``; it is written to the
  node 0600 for the service user and passed to the client as a file path, never on a command line.
"""

from __future__ import annotations

import functools
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from urllib.parse import quote

from pyinfra import host
from pyinfra.api import FactBase, deploy
from pyinfra.operations import files, pip

from servefleet import base, schema
from servefleet.paths import REPO_ROOT
from servefleet.python_env import install_args

SCRIPT = REPO_ROOT / "files" / "model" / "fetch_model.py"
RECORD = ".servefleet/verified.json"  # inside the model directory: "complete and verified"
SHA_RE = re.compile(r"^[0-9a-f]{40}$")

INCLUDE = schema.Check("a non-empty list of glob patterns (strings)",
                       lambda v: isinstance(v, (list, tuple)) and len(v) > 0
                       and all(isinstance(p, str) and p.strip() for p in v))

# Keys every host that holds a model needs (defaults: group_data/all.py, "# --- Models").
MODEL_KEYS = {
    "huggingface_hub_version": schema.TEXT,
    "download_margin_bytes": schema.integer(0),
    "hub_timeout_seconds": schema.integer(1),
    "depot_user": schema.NAME,
    "depot_address": schema.optional(schema.TEXT),
    "depot_ssh_key": schema.optional(schema.TEXT),
    "depot_bwlimit_kib": schema.optional(schema.integer(1)),
}
# The keys of deploys/model.py (one model per host, from data).
MODEL_DEPLOY_KEYS = {
    "model_repo": schema.REPO_ID,
    "model_revision": schema.REVISION,
    "model_include": INCLUDE,
    "model_dir": schema.optional(schema.ABS_PATH),
}


def validate_data(extra: dict | None = None) -> None:
    """base.validate_data with the model keys (and extra): bad data stops the run before changes."""
    base.validate_data(extra={**MODEL_KEYS, **(extra or {})})


def default_dir(data, repo_id: str) -> str:
    """Where deploys/model.py puts repo_id when model_dir is None."""
    return f"{data.servefleet_root}/models/{repo_id.replace('/', '--')}"


# -- the hub's API, from the operator side -----------------------------------------------------


class HubError(Exception):
    """The hub did not give us the commit or its file list; the message never holds the token."""


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
        from huggingface_hub.utils import filter_repo_objects

        return list(filter_repo_objects(self.files, allow_patterns=list(include),
                                        key=lambda f: f.path))


def _get_json(url: str, token: str | None, timeout: float, what: str):
    req = urllib.request.Request(url, headers={"Accept": "application/json",
                                               "User-Agent": "servefleet"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read()), resp.headers.get("Link")
    except urllib.error.HTTPError as exc:
        code = exc.headers.get("X-Error-Code") or ""
        if exc.code in (401, 403) or code in ("RepoNotFound", "GatedRepo"):
            hint = ("a token was sent but refused" if token else
                    "no token was given (set HF_TOKEN or hf_token_file)")
            raise HubError(f"{what}: the hub answered {exc.code} {code} - the repo does not exist, "
                           f"or it is private/gated and {hint}") from None
        if code == "RevisionNotFound":
            raise HubError(f"{what}: revision not found on the hub") from None
        raise HubError(f"{what}: the hub answered HTTP {exc.code} {code}".rstrip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HubError(f"{what}: cannot reach the hub: {reason}") from None


def _next_link(link: str | None) -> str | None:
    """The rel="next" URL of a Link header (the hub pages tree listings by 1000)."""
    for part in (link or "").split(","):
        m = re.match(r'\s*<([^>]+)>\s*;.*rel="?next"?', part)
        if m:
            return m.group(1)
    return None


@functools.lru_cache(maxsize=128)
def hub_commit(endpoint: str, repo_id: str, revision: str, token: str | None = None,
               timeout: float = 30) -> HubCommit:
    """The commit `revision` designates on the hub at endpoint, with every file (cached per run)."""
    endpoint = endpoint.rstrip("/")
    what = f"{repo_id}@{revision} on {endpoint}"
    sha = revision
    if not SHA_RE.fullmatch(revision):
        doc, _ = _get_json(f"{endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}",
                           token, timeout, what)
        sha = doc.get("sha") if isinstance(doc, dict) else None
        if not sha or not SHA_RE.fullmatch(sha):
            raise HubError(f"{what}: the hub's answer has no commit sha")
    out: list[HubFile] = []
    url = f"{endpoint}/api/models/{repo_id}/tree/{sha}?recursive=true"
    while url:
        entries, link = _get_json(url, token, timeout, what)
        for e in entries:
            if e.get("type") != "file":
                continue
            lfs = e.get("lfs") or {}
            out.append(HubFile(path=e["path"], size=int(e["size"]), oid=e.get("oid", ""),
                               sha256=lfs.get("oid") or lfs.get("sha256")))
        url = _next_link(link)
    return HubCommit(repo_id=repo_id, sha=sha, files=tuple(sorted(out, key=lambda f: f.path)))


def operator_token(data) -> str | None:
    """The hub token: the file hf_token_file names (operator side), else $HF_TOKEN, else None."""
    path = data.get("hf_token_file")
    if path:
        try:
            token = Path(path).expanduser().read_text().strip()
        except OSError as exc:
            raise schema.DataError(
                f"invalid data for host {host.name}: hf_token_file = {path!r} cannot be read "
                f"({exc.strerror}); nothing was changed") from None
        return token or None
    return os.environ.get("HF_TOKEN") or None


# -- facts -------------------------------------------------------------------------------------

_SIZES = "#servefleet-sizes"


class VerifiedModel(FactBase):
    """The record a verified download left in path (repo_id, revision, sha, include, files
    {path: size}, sha256 {path: hex}, source, verified_at), or None: no record, or a recorded
    file is now missing or of another size (truncated)."""

    def command(self, path):
        q = _shq(path)
        return (f"if [ -f {q}/{RECORD} ]; then cat {q}/{RECORD}; echo; echo '{_SIZES}'; "
                f"cd {q} && find . -path ./.servefleet -prune -o -path ./.cache -prune "
                "-o -type f -printf '%s %P\\n'; fi")

    def process(self, output):
        return parse_verified(output)


def _shq(text: str) -> str:
    import shlex

    return shlex.quote(text)


def parse_verified(lines: list[str]) -> dict | None:
    """VerifiedModel's parser: the record, if every recorded file is on disk at its size."""
    if _SIZES not in lines:
        return None
    cut = lines.index(_SIZES)
    try:
        record = json.loads("\n".join(lines[:cut]))
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return None
    on_disk = {}
    for line in lines[cut + 1:]:
        size, _, path = line.partition(" ")
        if size.isdigit():
            on_disk[path] = int(size)
    if any(on_disk.get(p) != s for p, s in record["files"].items()):
        return None
    return record


def satisfies(record: dict | None, repo_id: str, sha: str, include: list[str]) -> bool:
    """Does a verified record already hold repo_id at sha with these include patterns?"""
    return bool(record) and record.get("repo_id") == repo_id and record.get("sha") == sha \
        and sorted(record.get("include") or []) == sorted(include)


# -- deploy steps ------------------------------------------------------------------------------

def _once(step: str) -> bool:
    """True the first time a host asks for step in this run (State), however many models."""
    done = host.state.__dict__.setdefault("_servefleet_model_steps", set())
    if (host.name, step) in done:
        return False
    done.add((host.name, step))
    return True


def tools_python() -> str:
    return f"{base.tools_venv()}/bin/python"


def script_path() -> str:
    return f"{host.data.servefleet_root}/tools/fetch_model.py"


def token_path() -> str:
    return f"{host.data.servefleet_root}/etc/hf_token"


@deploy("Model tools")
def model_tools():
    """The fetch/verify script and servefleet's state dir for model requests."""
    root, user = host.data.servefleet_root, host.data.servefleet_user
    files.put(name="Model fetch/verify script", src=str(SCRIPT), dest=script_path(),
              user="root", group="root", mode="755")
    files.directory(name=f"Directory {root}/state/models", path=f"{root}/state/models",
                    user=user, group=user, mode="755")


@deploy("Hub client")
def hf_client():
    """huggingface_hub (the `hf` CLI) at the pinned version, in the tools venv."""
    version = host.data.huggingface_hub_version
    pip.packages(name=f"huggingface_hub {version} (hf CLI)",
                 packages=[f"huggingface_hub=={version}"], virtualenv=base.tools_venv(),
                 extra_install_args=install_args(host.data) or None)


@deploy("Hub token")
def hub_token():
    """The operator's hub token on the node (0600, service user), or no token file at all."""
    user = host.data.servefleet_user
    token = operator_token(host.data)
    if token:
        files.put(name="Hub token (0600)", src=StringIO(token + "\n"), dest=token_path(),
                  user=user, group=user, mode="600")
    else:
        files.file(name="No hub token (anonymous)", path=token_path(), present=False)


@dataclass
class ModelRun:
    """What ensure_model did on this host; read at execution time (e.g. `_if=run.changed`)."""

    fetch: object  # OperationMeta of the fetch-and-verify operation
    path: str  # the model directory (dest)

    def changed(self) -> bool:
        """True when this run fetched, replaced or removed files of the model."""
        return self.fetch.did_change()

    did_change = changed  # the OperationMeta spelling, so a ModelRun is a service dependency


def check_args(repo_id, revision, include, dest) -> None:
    problems = []
    for key, value, check in (("repo_id", repo_id, schema.REPO_ID),
                              ("revision", revision, schema.REVISION),
                              ("include", include, INCLUDE), ("dest", dest, schema.ABS_PATH)):
        if not check.ok(value):
            problems.append(f"{key} = {value!r}; expected {check.expected}")
    root = host.data.servefleet_root
    if isinstance(dest, str) and dest.rstrip("/") in ("", root, f"{root}/models", f"{root}/state",
                                                      host.data.get("depot_store") or ""):
        # The model owns dest: files of other revisions are removed from it.
        problems.append(f"dest = {dest!r}; expected a directory of its own, e.g. {root}/models/NAME")
    if problems:
        raise schema.DataError(f"invalid model for host {host.name}: " + "; ".join(problems)
                               + "; nothing was changed")


def _prepare(source: str) -> None:
    """The steps ensure_model needs once per host before its first model."""
    schema.validate(host, MODEL_KEYS)
    if _once("tools"):
        model_tools()
    if source == "hub":
        if _once("hub"):
            hf_client()
            hub_token()
    else:
        from servefleet import depot

        if _once("depot-access"):
            depot.node_access()


def _ensure(repo_id: str, revision: str, include: list[str], dest: str, source: str) -> ModelRun:
    from servefleet.operations import model as model_ops

    check_args(repo_id, revision, include, dest)
    _prepare(source)
    user = host.data.servefleet_user
    files.directory(name=f"Model directory {dest}", path=dest, user=user, group=user, mode="755")
    fetch = model_ops.fetch(
        name=f"{repo_id}@{revision}: fetch and verify ({source})",
        repo_id=repo_id, revision=revision, include=list(include), dest=dest, source=source,
    )
    return ModelRun(fetch=fetch, path=dest)


@deploy("Model")
def ensure_model(repo_id: str, revision: str, include: list[str], dest: str) -> ModelRun:
    """
    Put repo_id at revision into dest, verified, from the hub or the fleet's depot.

    + repo_id: hub repo id, e.g. ``Qwen/Qwen-AgentWorld-35B-A3B``
    + revision: branch, tag or 40-hex commit sha (``main`` follows the branch; a sha pins it)
    + include: glob patterns of the files to fetch, e.g. ``["*.json", "*.safetensors"]``
    + dest: the model directory on the node, owned by the service user

    ``host.data.model_source`` picks the source: ``hub`` (``hf_endpoint``, token from
    ``hf_token_file`` or ``$HF_TOKEN``) or ``depot`` (rsync from ``depot_host``). Returns a
    ModelRun: ``.changed()`` (at execution time) and ``.path``.

    **Example:**

    .. code:: python

        run = models.ensure_model(repo_id="org/name", revision="main", include=["*"],
                                  dest="/opt/servefleet/models/name")
    """
    return _ensure(repo_id, revision, include, dest, host.data.model_source)
