"""Every path servefleet uses on a node, in one place.

Steps, operations, drift, status, bench, rebuild, rollout and teardown ask a `NodeLayout` for
paths; nothing else spells a node path. Scripts under files/ get their paths as arguments.

    {root}/                         servefleet_root: root-owned, 0755
        bin/                        scripts root runs (health, fetch, lint, build, evict, ...)
        tools/venv/                 servefleet's own node-side tools (uv, hf, gguf)
        venvs/<engine>-<version>/   one serving venv per engine version (vllm-0.24.0)
        llama.cpp/src|build/        llama.cpp clone and scratch build tree
        llama.cpp/<tag>-<hash>/     one installed build (bin/llama-server, build.json)
        llama.cpp/current           -> the build the current release serves
        etc/api-key                 the API key, one line, root 0600 (both engines)
        etc/vllm.env                VLLM_API_KEY=..., derived from etc/api-key, root 0600
        etc/hf-token                the hub token, 0400 owned by the service user, which fetches
                                    (passed to the fetcher as a file, never in argv)
        etc/depot-key|known-hosts   fleet key and the depot's host key (nodes of a depot)
        state/                      root's records: releases.json, running.json, rollout.json,
                                    last-rollout.json (what the last rollout did here),
                                    checks.json (the last health and drift checks),
                                    fetch requests, verified/ (which model directories are
                                    complete and verified: out of the engine's reach)
        cache/                      the service user's: HOME, HF home, engine caches (writable)
        depot/                      the depot's store (depot_store; follows a moved root)
    {models_root}/<org>--<name>/<sha>/   one model commit (the service user's; writable)
    {metrics_textfile_dir}/servefleet.prom   node_exporter's textfile (root 0644, core.metrics)

The service user writes only `cache/` and `{models_root}`; everything root executes is
outside them and root-owned.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from servefleet.core.errors import DataError

TEXTFILE_NAME = "servefleet.prom"  # node_exporter's textfile collector reads *.prom only

UNIT_DIR = "/etc/systemd/system"
VLLM_UNIT = "servefleet-vllm.service"
LLAMA_UNIT = "servefleet-llama.service"
# Root's mark in each directory servefleet made its own (servefleet_root, a relocated models root
# or depot store): how a later run tells its own directory from one that only has the name.
OWN_MARKER = ".servefleet-own"


def revision_dirname(revision: str) -> str:
    """A revision as one directory name: '/' becomes '~', which git refs never contain."""
    return revision.replace("/", "~")


def repo_dirname(repo_id: str) -> str:
    """org/name -> org--name."""
    return repo_id.replace("/", "--")


@dataclass(frozen=True)
class NodeLayout:
    root: str  # servefleet_root
    user: str = "servefleet"  # servefleet_user: owns cache/ and the models root
    models_root: str = ""  # "" -> {root}/models
    depot_store: str = ""  # "" -> {root}/depot
    metrics_dir: str = ""  # metrics_textfile_dir: node_exporter's textfile directory; "": none

    @classmethod
    def of(cls, data) -> NodeLayout:
        """The layout a host's data describes (host.data or a dict)."""
        get = data.get if hasattr(data, "get") else (lambda k: getattr(data, k, None))
        return cls(
            root=_required(get, "servefleet_root"),
            user=get("servefleet_user") or "servefleet",
            models_root=get("models_root") or "",
            depot_store=get("depot_store") or "",
            metrics_dir=get("metrics_textfile_dir") or "",
        )

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # --- the tree ---------------------------------------------------------------------------
    @property
    def tree(self) -> tuple[str, ...]:
        """Directories made by the base deploy, root-owned 0755."""
        return (
            self.root,
            self.bin_dir,
            self.tools_dir,
            self.venvs_dir,
            self.etc_dir,
            self.state_dir,
        )

    def own_dirs(self, depot: bool) -> tuple[tuple[str, str], ...]:
        """(data key, directory) of each directory servefleet makes its own on this node: the
        root, and the models root and (on a depot) the store where data moves them out of it."""
        found = [("servefleet_root", self.root)]
        if self.models_root:
            found.append(("models_root", self.models_root))
        if depot and self.depot_store:
            found.append(("depot_store", self.depot_store))
        return tuple(found)

    @staticmethod
    def own_marker(directory: str) -> str:
        return posixpath.join(directory, OWN_MARKER)

    @property
    def engine_hidden_dirs(self) -> tuple[str, ...]:
        """What no engine may read: the secrets (etc/) and root's records (state/)."""
        return (self.etc_dir, self.state_dir)

    @property
    def writable_dirs(self) -> tuple[str, ...]:
        """The only directories the service user may write (owned by it, 0750)."""
        return (self.cache_dir, self.models_dir)

    @property
    def bin_dir(self) -> str:
        return self._p("bin")

    def bin(self, name: str) -> str:
        return self._p("bin", name)

    @property
    def etc_dir(self) -> str:
        return self._p("etc")

    @property
    def state_dir(self) -> str:
        return self._p("state")

    @property
    def cache_dir(self) -> str:
        return self._p("cache")

    # --- tools and engines --------------------------------------------------------------------
    @property
    def tools_dir(self) -> str:
        return self._p("tools")

    @property
    def tools_venv(self) -> str:
        return self._p("tools", "venv")

    @property
    def tools_python(self) -> str:
        return self._p("tools", "venv", "bin", "python")

    def tools_bin(self, name: str) -> str:
        return self._p("tools", "venv", "bin", name)

    @property
    def venvs_dir(self) -> str:
        return self._p("venvs")

    def engine_venv(self, engine: str, version: str) -> str:
        """One venv per engine version: venvs/vllm-0.24.0."""
        return self._p("venvs", f"{engine}-{version}")

    @property
    def llama_dir(self) -> str:
        return self._p("llama.cpp")

    @property
    def llama_src(self) -> str:
        return self._p("llama.cpp", "src")

    @property
    def llama_build_dir(self) -> str:
        return self._p("llama.cpp", "build")

    def llama_prefix(self, build: str) -> str:
        return self._p("llama.cpp", build)

    def llama_server(self, build: str) -> str:
        return self._p("llama.cpp", build, "bin", "llama-server")

    @property
    def llama_current(self) -> str:
        return self._p("llama.cpp", "current")

    # --- models ---------------------------------------------------------------------------------
    @property
    def models_dir(self) -> str:
        return self.models_root or self._p("models")

    def model_repo_dir(self, repo_id: str) -> str:
        return posixpath.join(self.models_dir, repo_dirname(repo_id))

    def model_dir(self, repo_id: str, sha: str) -> str:
        """One directory per repo and commit (a revision resolved to its sha), so what a previous
        release serves is never overwritten when a branch moves."""
        return posixpath.join(self.model_repo_dir(repo_id), revision_dirname(sha))

    # --- secrets and configuration ------------------------------------------------------------
    @property
    def api_key_file(self) -> str:
        return self._p("etc", "api-key")

    @property
    def vllm_env_file(self) -> str:
        return self._p("etc", "vllm.env")

    @property
    def hf_token_file(self) -> str:
        return self._p("etc", "hf-token")

    @property
    def depot_key(self) -> str:
        return self._p("etc", "depot-key")

    @property
    def depot_known_hosts(self) -> str:
        return self._p("etc", "depot-known-hosts")

    # --- state ----------------------------------------------------------------------------------
    @property
    def releases_file(self) -> str:
        return self._p("state", "releases.json")

    @property
    def running_file(self) -> str:
        """Which release the service was last (re)started with and found healthy."""
        return self._p("state", "running.json")

    @property
    def checks_file(self) -> str:
        """The last health and drift checks (core.metrics.Checks)."""
        return self._p("state", "checks.json")

    @property
    def metrics_textfile(self) -> str | None:
        """servefleet's node_exporter textfile (core.metrics); None without a directory."""
        return posixpath.join(self.metrics_dir, TEXTFILE_NAME) if self.metrics_dir else None

    @property
    def rollout_marker(self) -> str:
        return self._p("state", "rollout.json")

    @property
    def last_rollout(self) -> str:
        """What the last rollout did on this node (core.rollout_record), for `report`."""
        return self._p("state", "last-rollout.json")

    @property
    def requests_dir(self) -> str:
        return self._p("state", "requests")

    def fetch_request(self, dest: str) -> str:
        """The fetch request for a model directory (named after it, inside state/requests)."""
        slug = dest.strip("/").replace("/", "_") or "root"
        return posixpath.join(self.requests_dir, f"{slug}.json")

    @property
    def verified_dir(self) -> str:
        return self._p("state", "verified")

    def model_record(self, dest: str) -> str:
        """Root's record that the model directory dest is complete and verified (named after
        it, like its fetch request). Not inside dest: the engine can write there."""
        slug = dest.strip("/").replace("/", "_") or "root"
        return posixpath.join(self.verified_dir, f"{slug}.json")

    @property
    def page_cache_record(self) -> str:
        return self._p("state", "page-cache-evict.json")

    @property
    def hf_home(self) -> str:
        """The hub client's home for downloads (the service user's)."""
        return self._p("cache", "hf-home")

    # --- depot ----------------------------------------------------------------------------------
    @property
    def depot_dir(self) -> str:
        return self.depot_store or self._p("depot")

    def depot_model_dir(self, repo_id: str, sha: str) -> str:
        """The depot's verified copy of repo_id at a commit sha (what nodes rsync from)."""
        return posixpath.join(self.depot_dir, repo_dirname(repo_id), sha)

    def depot_rsync_path(self, repo_id: str, sha: str) -> str:
        """depot_model_dir relative to the store: what the read-only rsync account sees."""
        return f"{repo_dirname(repo_id)}/{sha}"

    def depot_ref(self, repo_id: str, revision: str) -> str:
        """Which sha the depot holds verified for repo_id at revision (root's record)."""
        return self._p("state", "depot-refs", repo_dirname(repo_id), revision_dirname(revision))

    @property
    def depot_home(self) -> str:
        return self._p("depot-home")

    # --- systemd --------------------------------------------------------------------------------
    @staticmethod
    def unit_path(unit: str) -> str:
        return posixpath.join(UNIT_DIR, unit)

    @staticmethod
    def unit_cgroup(unit: str) -> str:
        """A service's cgroup on a unified hierarchy (our units stay in system.slice)."""
        return posixpath.join("/sys/fs/cgroup/system.slice", unit)


def check_host(address: str) -> str:
    """Where a check on the node reaches an API bound to `address`: a wildcard bind answers
    on loopback; an IPv6 literal gets brackets."""
    if address in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{address}]" if ":" in address else address


def api_url(data) -> str:
    """The API's base URL as seen from the node itself."""
    get = data.get if hasattr(data, "get") else (lambda k: getattr(data, k, None))
    return f"http://{check_host(_required(get, 'service_host'))}:{get('service_port')}"


def _required(get, key: str) -> str:
    """A key the data always has (group_data/all.py sets it, the contract checks it)."""
    value = get(key)
    if value is None:
        raise DataError(f"{key} is not set in this host's data (group_data/all.py sets it)")
    return value
