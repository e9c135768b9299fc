"""Validation of a host's data against the contract: one function, used at inventory load
(before any connection) and again by every recipe when its deploy is loaded.

A host's data comes in layers, highest precedence first, as pyinfra merges them:
`--data`, the host's own data (fleet.yml `data:`), its groups' group_data files (the
inventory's file-name group last in pyinfra's order, so first here), group_data/all.py.
Every layer is checked for unknown keys, naming the layer's file and the closest known key;
the merged values are checked against the declared checks and the cross-key rules.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servefleet.core import validate as c
from servefleet.core.errors import DataError
from servefleet.core.fleetkey import depot_key_problem
from servefleet.core.operator_files import ssh_key_problem
from servefleet.core.owned_flags import owned_flag_problems
from servefleet.core.secrets import SecretError, read_secret
from servefleet.fleet import contract, registry


@dataclass
class Layer:
    source: str  # where these values were written, e.g. "group_data/spark.py"
    values: Mapping[str, Any]


@dataclass
class HostData:
    """What validation needs to know of one host."""

    name: str
    groups: Sequence[str]
    layers: list[Layer] = field(default_factory=list)  # highest precedence first

    def merged(self) -> dict:
        out: dict = {}
        for layer in reversed(self.layers):
            out.update(layer.values)
        return out

    def source_of(self, key: str) -> str:
        for layer in self.layers:
            if key in layer.values:
                return layer.source
        return "no file"


def suggestion(key: str) -> str:
    close = difflib.get_close_matches(key, contract.BY_NAME, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_key_problems(layer: Layer) -> list[str]:
    return [
        f"unknown key {key!r} in {layer.source}{suggestion(key)}"
        for key in layer.values
        if key not in contract.BY_NAME and not contract.is_pyinfra_key(key)
    ]


def _value_problem(key: str, value, source: str) -> str:
    check = contract.BY_NAME[key].check
    return (
        f"key {key!r} = {c.show(value)} ({type(value).__name__}) from {source}; "
        f"expected {check.expected}"
    )


def recipe_applies(recipe: str | None, groups: Sequence[str]) -> bool:
    """A serving deploy acts only on hosts of its engine, the depot's on depots; on other hosts
    it is a visible no-op (servefleet.fleet.registry.applies)."""
    return registry.applies(recipe, groups)


def value_problems(host: HostData, data: Mapping, recipe: str | None = None) -> list[str]:
    """Declared checks, cross-key rules and operator-side files of the merged data."""
    problems = []
    testbed = "testbed" in host.groups
    for key, value in data.items():
        knob = contract.BY_NAME.get(key)
        if knob is None:
            continue
        if knob.scope == contract.TESTBED and value is not None and not testbed:
            problems.append(
                f"key {key!r} is testbed-only (set in {host.source_of(key)}), and "
                f"{host.name} is not a testbed host"
            )
        elif not knob.check.ok(value):
            problems.append(_value_problem(key, value, host.source_of(key)))
    if problems:
        return problems  # cross-key rules assume well-formed values

    applies = recipe_applies(recipe, host.groups)
    if recipe and applies:
        for knob in contract.KNOBS:
            if contract.required(knob, recipe) and data.get(knob.name) is None:
                problems.append(
                    f"key {knob.name!r} is missing; deploys/{recipe}.py needs {knob.check.expected}"
                )
    engine = registry.engine_of_deploy(recipe) if applies else None
    serving = engine is not None
    if (
        data.get("model_source") == "depot"
        and not data.get("depot_host")
        and contract.fetches_model(recipe)
        and applies
    ):
        problems.append(
            "key 'depot_host' is missing; expected the depot's inventory name when "
            "model_source = 'depot'"
        )
    host_addr = data.get("service_host")
    if serving and host_addr and not c.is_loopback(host_addr) and not data.get("api_key_file"):
        problems.append(
            f"key 'api_key_file' is missing: the API binds {host_addr}, reachable "
            f"from other machines, and must require a key (set api_key_file, or "
            f"service_host = 127.0.0.1)"
        )
    for key in ("api_key_file", "hf_token_file"):
        if data.get(key) and (serving or key == "hf_token_file"):
            try:
                read_secret(data[key])
            except SecretError as exc:
                problems.append(f"key {key!r} from {host.source_of(key)}: {exc}")
    login_key = data.get("ssh_key")  # here, not as a traceback when pyinfra connects
    login_problem = login_key is not None and ssh_key_problem(login_key)
    if login_problem:
        problems.append(
            f"key 'ssh_key' from {host.source_of('ssh_key')}: {login_problem}; expected the SSH "
            f"private key to log in to {host.name} with"
        )
    key_problem = depot_key_problem(data)  # here, not when the depot or a copy first needs it
    if key_problem:
        problems.append(
            f"key 'depot_ssh_key' from {host.source_of('depot_ssh_key')}: {key_problem}"
        )
    if (
        data.get("perf_gate", True)
        and data.get("perf_gate_decode_drop_pct") is None
        and data.get("perf_gate_ttft_rise_pct") is None
    ):
        problems.append(
            "keys 'perf_gate_decode_drop_pct' and 'perf_gate_ttft_rise_pct' are both "
            "None: a gate that checks nothing would pass any release (set one, or "
            "perf_gate = False to switch the gate off)"
        )
    problems += account_problems(host, data)
    if engine is not None:
        key = engine.extra_args_key
        problems += owned_flag_problems(
            key, data.get(key), engine.owned_flags, engine.abbreviations
        )
    problems += layout_problems(data)
    problems += root_reads_problems(data)
    problems += metrics_dir_problems(data)
    return problems


def account_problems(host: HostData, data: Mapping) -> list[str]:
    """The accounts servefleet makes its own (servefleet_user, made nologin; on a depot the
    depot_user, forced to rrsync) are never the account it logs in as, nor each other."""
    managed = {"servefleet_user": data.get("servefleet_user")}
    if registry.keeps_store(host.groups):
        managed["depot_user"] = data.get("depot_user")
    login = data.get("ssh_user")
    problems = []
    for key, account in managed.items():
        if account and account == login:
            problems.append(
                f"key {key!r} = {account!r} from {host.source_of(key)} is the SSH "
                f"login user (ssh_user) of {host.name}: servefleet would take that "
                f"account over and lock you out; expected an account of its own"
            )
    if len(managed) == 2 and managed["servefleet_user"] == managed["depot_user"]:
        problems.append(
            f"keys 'servefleet_user' and 'depot_user' are both "
            f"{managed['depot_user']!r}: expected two separate accounts"
        )
    return problems


def layout_problems(data: Mapping) -> list[str]:
    """The directories data relocates against root's tree and each other (core.layout names
    them): the service user's (models_root) and the depot's store never hold, sit in or share
    servefleet_root's tree (but at their own default places in it), nor each other."""
    problems = []
    root = data.get("servefleet_root")
    own = {"models_root": "models", "depot_store": "depot"}
    placed = {}
    for key, default in own.items():
        other = data.get(key)
        if not (root and other):
            continue
        if other == root or c.inside(root, other):
            problems.append(
                f"key {key!r} = {other!r} holds servefleet_root {root!r}; expected a "
                f"directory of its own"
            )
        elif c.inside(other, root) and posixpath.normpath(other) != f"{root}/{default}":
            problems.append(
                f"key {key!r} = {other!r} is inside servefleet_root {root!r}, whose "
                f"tree is root's; expected {root}/{default} or a directory outside it"
            )
        placed[key] = other
    if len(placed) == 2:
        a, b = placed["models_root"], placed["depot_store"]
        if a == b or c.inside(a, b) or c.inside(b, a):
            problems.append(
                f"keys 'models_root' = {a!r} and 'depot_store' = {b!r} overlap; "
                f"expected two separate directories"
            )
    return problems


# Where root may take what it installs from, runs or compiles with (uv's and ccache's caches,
# local wheel directories, the interpreter the venvs are made from): places only root writes on
# a node. An allow list of parents, then never the service user's own directories.
ROOT_READ_PARENTS = (
    "/usr",
    "/opt",
    "/srv",
    "/var/cache",
    "/var/lib",
    "/var/opt",
    "/root",
    "/mnt",
    "/data",
    "/scratch",
)


def root_reads(data: Mapping) -> list[tuple[str, str]]:
    """(key, path) of every path knob whose files root consumes."""
    places = [(k, data[k]) for k in ("uv_cache_dir", "llamacpp_ccache_dir") if data.get(k)]
    places += [
        (f"pip_find_links[{i}]", v.removeprefix("file://"))
        for i, v in enumerate(data.get("pip_find_links") or [])
        if isinstance(v, str) and (v.startswith("/") or v.startswith("file://"))
    ]
    url = data.get("llamacpp_git_url")  # a local repository: root clones and builds from it
    if isinstance(url, str) and (url.startswith("/") or url.startswith("file://")):
        places.append(("llamacpp_git_url", url.removeprefix("file://")))
    places += [
        (f"python_interpreter[{family!r}]", v)
        for family, v in (data.get("python_interpreter") or {}).items()
        if isinstance(v, str) and "/" in v
    ]
    return places


def root_reads_problems(data: Mapping) -> list[str]:
    """Root never installs from, runs or compiles with what another user can write: each
    root-consumed path lies inside an allow-listed parent and outside the service user's
    directories (its cache, the models root, the depot's store)."""
    root = data.get("servefleet_root") or ""
    theirs = [
        d
        for d in (
            f"{root}/cache" if root else None,
            data.get("models_root") or (f"{root}/models" if root else None),
            data.get("depot_store") or (f"{root}/depot" if root else None),
        )
        if d
    ]
    problems = []
    for key, path in root_reads(data):
        norm = posixpath.normpath(path)
        if not path.startswith("/") or not any(c.inside(norm, p) for p in ROOT_READ_PARENTS):
            problems.append(
                f"key {key} = {path!r}: root installs from or runs what is there; "
                f"expected a path inside {', '.join(ROOT_READ_PARENTS)}, which only "
                f"root writes"
            )
        elif any(norm == d or c.inside(norm, d) for d in theirs):
            owner = next(d for d in theirs if norm == d or c.inside(norm, d))
            problems.append(
                f"key {key} = {path!r} is inside {owner}, which the service user "
                f"writes, and root installs from or runs what is there; expected a "
                f"directory only root writes"
            )
    return problems


def metrics_dir_problems(data: Mapping) -> list[str]:
    """node_exporter's textfile directory (metrics_textfile_dir), where root writes what
    Prometheus is told: inside an allow-listed parent only root writes, and outside
    servefleet_root's tree and the service user's directories (no engine can change it)."""
    path = data.get("metrics_textfile_dir")
    if not isinstance(path, str):
        return []
    root = data.get("servefleet_root") or ""
    theirs = [
        d for d in (root, data.get("models_root"), data.get("depot_store")) if isinstance(d, str)
    ]
    if not any(c.inside(path, p) for p in ROOT_READ_PARENTS):
        return [
            f"key 'metrics_textfile_dir' = {path!r}: root writes servefleet's metrics there; "
            f"expected a directory inside {', '.join(ROOT_READ_PARENTS)}, which only root "
            f"writes (e.g. /var/lib/prometheus/node-exporter)"
        ]
    for d in theirs:
        if d and (path == d or c.inside(path, d) or c.inside(d, path)):
            return [
                f"key 'metrics_textfile_dir' = {path!r} overlaps {d}, servefleet's own tree "
                f"or the service user's; expected node_exporter's directory, apart from them"
            ]
    return []


def normalised(data: Mapping) -> dict:
    """The values of `data` written in another form than the one servefleet reads (a size:
    8GiB), read (8589934592); only valid values, only the keys that change."""
    out = {}
    for key, value in data.items():
        knob = contract.BY_NAME.get(key)
        if knob is not None and knob.check.normal is not None and knob.check.ok(value):
            normal = knob.check.normal(value)
            if normal != value or type(normal) is not type(value):
                out[key] = normal
    return out


def settle(host_data) -> None:
    """Give a pyinfra host's data (`host.data`: --data over fleet.yml over group_data) each
    value as servefleet reads it, by pyinfra's own way to set a host's data (`host.data.key =`,
    which no other layer overrides): every reader then sees 8589934592, not 8GiB."""
    for key, value in normalised(host_data.dict()).items():
        setattr(host_data, key, value)


def validate(host: HostData, recipe: str | None = None) -> dict:
    """The merged data of a valid host, each value as servefleet reads it (normalised); DataError
    (one line, nothing changed) otherwise."""
    problems = [p for layer in host.layers for p in unknown_key_problems(layer)]
    data = host.merged()
    if not problems:
        problems = value_problems(host, data, recipe)
    if problems:
        raise DataError(
            f"invalid data for host {host.name}: " + "; ".join(problems) + "; nothing was changed"
        )
    return {**data, **normalised(data)}


def recipe_of(deploy_path: str | None) -> str | None:
    """deploys/serve_bf16.py -> "serve_bf16" (None for a file that is no servefleet deploy)."""
    if not deploy_path:
        return None
    stem = deploy_path.rsplit("/", 1)[-1].removesuffix(".py")
    return stem if stem in registry.all_deploys() else None


def serving_digest(data: Mapping) -> str:
    """sha256 of the knobs that change what serves (contract: serving=True), for releases."""
    data = {**data, **normalised(data)}  # 8GiB and 8589934592 are one release
    doc = {k: data.get(k) for k in sorted(contract.serving_keys())}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
