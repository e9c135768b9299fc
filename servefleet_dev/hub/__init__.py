"""The local hub: a server speaking the Hugging Face hub's file API, for tests, the testbed and
benchmarks.

huggingface.co is not reachable from our machines, so this serves model repos from a directory with
the subset of the hub's HTTP contract that the real `huggingface_hub` client (`hf_hub_download`,
`snapshot_download`, `hf download`, `hf cache verify`) needs when pointed at it with HF_ENDPOINT.

Modules:

    store.py    publish() and HubStore: content-addressed repos, commits, refs (layout there)
    state.py    what the listening sockets of one process share: byte counters, fault rules
    api.py      the JSON documents of the /api/ endpoints
    handler.py  the request handler (and what it answers to malformed requests)
    server.py   make_server, running_hub, serve; the bind check (check_address)
    control.py  clients of the operator endpoints (hub_stats, set_fault, ...)

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

from servefleet_dev.hub.control import clear_faults, hub_stats, set_fault, wait_ready
from servefleet_dev.hub.handler import HubRequestHandler
from servefleet_dev.hub.server import (
    AddressError,
    HubHTTPServer,
    check_address,
    format_url,
    make_server,
    running_hub,
    serve,
)
from servefleet_dev.hub.state import FaultRule, Faults, HubState, Stats
from servefleet_dev.hub.store import (
    LFS_EXTENSIONS,
    LFS_THRESHOLD,
    REPO_TYPES,
    Commit,
    FileEntry,
    HubStore,
    RepoNotFound,
    RevisionNotFound,
    git_blob_sha1,
    is_lfs,
    lfs_pointer,
    publish,
    repo_dir,
)

__all__ = [
    "LFS_EXTENSIONS",
    "LFS_THRESHOLD",
    "REPO_TYPES",
    "Commit",
    "FileEntry",
    "HubStore",
    "RepoNotFound",
    "RevisionNotFound",
    "git_blob_sha1",
    "is_lfs",
    "lfs_pointer",
    "publish",
    "repo_dir",
    "FaultRule",
    "Faults",
    "HubState",
    "Stats",
    "HubRequestHandler",
    "AddressError",
    "HubHTTPServer",
    "check_address",
    "format_url",
    "make_server",
    "running_hub",
    "serve",
    "clear_faults",
    "hub_stats",
    "set_fault",
    "wait_ready",
]
