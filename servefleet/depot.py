"""The model depot: downloads and verifies each model once; the fleet's nodes copy it from there.

Depot side (deploys/depot.py, data: group_data/depot.py):

- every model of ``depot_models`` is fetched from the hub and verified like on any node, into
  ``{depot_store}/{org}/{name}/{commit sha}/`` (its ``.servefleet/verified.json`` lists every
  file with its sha256: the manifest nodes verify against), then
  ``{depot_store}/{org}/{name}/refs/{revision}`` names the sha (written only after verification);
- a read-only account (``depot_user``) whose only key is the fleet key, forced to
  ``rrsync -ro {depot_store}``: it can read the store over rsync and do nothing else.

Node side (``model_source = "depot"``, ``depot_host`` = the depot's inventory name): the fleet
key's private half (0600, service user) and the depot's SSH host key (read from the depot itself,
so nothing is trusted on first use); ``servefleet.operations.model.fetch`` then rsyncs the files
(``--partial``: an interrupted copy resumes) and verifies them against the depot's manifest.

The fleet key is the operator's: ``depot_ssh_key`` (a private key file) or one generated once into
the servefleet cache (``~/.cache/servefleet/fleet/depot_ed25519``). Operators sharing a fleet
share that file (set depot_ssh_key).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from urllib.parse import quote

from gevent.lock import RLock
from pyinfra import host
from pyinfra.api import FactBase, deploy, operation
from pyinfra.operations import files, server

from servefleet import models, schema
from servefleet.operations.node import fail_host
from servefleet.paths import cache_subdir

RRSYNC = "/usr/bin/rrsync"  # rsync >= 3.2.4 ships it (Debian 12, Ubuntu 24.04)


def _model_entry_ok(v) -> bool:
    return (isinstance(v, dict) and set(v) <= {"repo_id", "revision", "include"}
            and schema.REPO_ID.ok(v.get("repo_id"))
            and (v.get("revision") is None or schema.REVISION.ok(v["revision"]))
            and (v.get("include") is None or models.INCLUDE.ok(v["include"])))


DEPOT_MODELS = schema.Check(
    'a list of {"repo_id": "org/name", "revision": "main" (or a sha), "include": ["*"]}',
    lambda v: isinstance(v, (list, tuple)) and all(_model_entry_ok(x) for x in v))

# Keys of the depot role (defaults: group_data/depot.py).
DEPOT_KEYS = {
    "depot_store": schema.ABS_PATH,
    "depot_models": DEPOT_MODELS,
}


def validate_data() -> None:
    models.validate_data(extra=DEPOT_KEYS)


def depot_models(data) -> list[dict]:
    """depot_models with the defaults filled in (revision main, include everything)."""
    return [{"repo_id": m["repo_id"], "revision": m.get("revision") or "main",
             "include": list(m.get("include") or ["*"])} for m in data.get("depot_models") or []]


# -- the fleet key (operator side) -------------------------------------------------------------


def fleet_key_path(data) -> Path:
    """The fleet key's private half on the operator's machine; generated on first use."""
    if data.get("depot_ssh_key"):
        path = Path(data["depot_ssh_key"]).expanduser()
        if not path.is_file():
            raise schema.DataError(
                f"invalid data for host {host.name}: depot_ssh_key = {str(path)!r} is not a file; "
                "nothing was changed")
        return path
    path = cache_subdir("fleet") / "depot_ed25519"
    if not path.exists():
        _generate_key(path)
    return path


def _generate_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(tmp, 0o600)
    try:
        os.link(tmp, path)  # atomic, and never replaces a key another run made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def fleet_key(data) -> tuple[str, str]:
    """(private key text, public key line) of the fleet key."""
    from cryptography.hazmat.primitives import serialization

    path = fleet_key_path(data)
    private = path.read_text()
    key = serialization.load_ssh_private_key(private.encode(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} servefleet-fleet"


# -- facts read on the depot -------------------------------------------------------------------


class SshHostKey(FactBase):
    """The host's ed25519 SSH host key line (`ssh-ed25519 AAAA...`)."""

    def command(self):
        return "cat /etc/ssh/ssh_host_ed25519_key.pub"

    def process(self, output):
        parts = " ".join(output).split()
        return " ".join(parts[:2]) if len(parts) >= 2 else None


def ref_path(store: str, repo_id: str, revision: str) -> str:
    return f"{store}/{repo_id}/refs/{quote(revision, safe='')}"


class DepotRef(FactBase):
    """The commit sha the depot holds verified for repo_id at revision, or None."""

    def command(self, store, repo_id, revision):
        return f"cat {shlex.quote(ref_path(store, repo_id, revision))} 2>/dev/null || true"

    def process(self, output):
        sha = "".join(output).strip()
        return sha if models.SHA_RE.fullmatch(sha) else None


# -- where the depot is (node side) ------------------------------------------------------------


@dataclass(frozen=True)
class DepotHost:
    name: str
    host: object  # the depot's pyinfra Host (facts are read on it)
    address: str  # where nodes reach it (the private network)
    port: int
    user: str
    store: str


def locate(name: str) -> DepotHost:
    """The depot host by inventory name; DataError when it is not in this run's inventory."""
    depot = host.inventory.get_host(name, default=None)
    if depot is None:
        raise schema.DataError(
            f"invalid data for host {host.name}: depot_host = {name!r} is not a host of this "
            "inventory (use one that holds the depot too, e.g. inventory/fleet.py with --limit); "
            "nothing was changed")
    data = depot.data
    return DepotHost(
        name=name, host=depot,
        address=data.get("depot_address") or data.get("ssh_hostname") or name,
        port=int(data.get("ssh_port") or 22),
        user=data.get("depot_user") or "sfdepot",
        store=data.get("depot_store") or "/opt/servefleet/depot",
    )


# Nodes read facts on the depot from their own greenlets: one at a time, or two of them race to
# open the depot's SSH connection.
_depot_lock = RLock()


def depot_fact(where: DepotHost, cls, **kwargs):
    with _depot_lock:
        return where.host.get_fact(cls, **kwargs)


def ref_on_depot(where: DepotHost, repo_id: str, revision: str) -> str | None:
    return depot_fact(where, DepotRef, store=where.store, repo_id=repo_id, revision=revision)


def key_path() -> str:
    return f"{host.data.servefleet_root}/etc/depot_key"


def known_hosts_path() -> str:
    return f"{host.data.servefleet_root}/etc/depot_known_hosts"


def request_fields(where: DepotHost, repo_id: str, sha: str) -> dict:
    """The fetch request's "depot" part: rsync source and SSH access."""
    return {"host": where.address, "port": where.port, "user": where.user,
            "path": f"{repo_id}/{sha}", "key": key_path(), "known_hosts": known_hosts_path(),
            "bwlimit_kib": host.data.get("depot_bwlimit_kib")}


@operation()
def known_hosts(path: str, depot_host: str):
    """
    Pin the depot's SSH host key, read from the depot itself, in a known_hosts file.

    + path: the known_hosts file to write
    + depot_host: the depot's inventory name

    **Example:**

    .. code:: python

        depot.known_hosts(path="/opt/servefleet/etc/depot_known_hosts", depot_host="depot-1")
    """
    where = locate(depot_host)
    key = depot_fact(where, SshHostKey)
    if not key:
        yield fail_host(f"cannot read the SSH host key of depot {where.name}")
        return
    name = where.address if where.port == 22 else f"[{where.address}]:{where.port}"
    user = host.data.servefleet_user
    yield from files.put._inner(src=StringIO(f"{name} {key}\n"), dest=path, user=user,
                                group=user, mode="644")


@deploy("Depot access")
def node_access():
    """On a node that copies models from the depot: the fleet key and the depot's host key."""
    locate(host.data.depot_host)  # bad depot_host stops the run here, before any change
    user = host.data.servefleet_user
    private, _ = fleet_key(host.data)
    files.put(name="Fleet key for the depot (0600)", src=StringIO(private), dest=key_path(),
              user=user, group=user, mode="600")
    known_hosts(name="Depot host key (known_hosts)", path=known_hosts_path(),
                depot_host=host.data.depot_host)


# -- the depot itself ------------------------------------------------------------------------


@deploy("Depot read-only account")
def account():
    """depot_user: logs in only with the fleet key, forced to `rrsync -ro depot_store`."""
    root, user, store = host.data.servefleet_root, host.data.servefleet_user, host.data.depot_store
    depot_user = host.data.depot_user
    home = f"{root}/depot-home"
    _, public = fleet_key(host.data)
    files.directory(name=f"Depot store {store}", path=store, user=user, group=user, mode="755")
    server.group(name=f"Group {depot_user}", group=depot_user, system=True)
    # A shell, because sshd runs the forced command through it; the key allows nothing else.
    server.user(name=f"Depot user {depot_user}", user=depot_user, group=depot_user, system=True,
                home=home, shell="/bin/sh", create_home=False, ensure_home=False)
    for d in (home, f"{home}/.ssh"):  # root-owned: the account cannot change its own keys
        files.directory(name=f"Directory {d}", path=d, user="root", group="root", mode="755")
    line = f'restrict,command="{RRSYNC} -ro {store}" {public}\n'
    files.put(name="Fleet key, read-only rsync of the store", src=StringIO(line),
              dest=f"{home}/.ssh/authorized_keys", user="root", group="root", mode="644")


@operation()
def depot_model(repo_id: str, revision: str, include: list[str], store: str):
    """
    Keep one verified copy of repo_id at revision in the depot's store, and its ref.

    + repo_id: hub repo id
    + revision: branch, tag or commit sha (the ref file maps it to the sha)
    + include: glob patterns of the files to keep
    + store: the depot's store directory

    **Example:**

    .. code:: python

        depot.depot_model(repo_id="org/name", revision="main", include=["*"],
                          store="/opt/servefleet/depot")
    """
    from servefleet.operations import model as model_ops

    try:
        commit = models.hub_commit(host.data.hf_endpoint, repo_id, revision,
                                   models.operator_token(host.data),
                                   host.data.hub_timeout_seconds)
    except models.HubError as exc:
        yield fail_host(str(exc))
        return
    dest = f"{store}/{repo_id}/{commit.sha}"
    yield from model_ops.fetch._inner(repo_id=repo_id, revision=revision, include=include,
                                      dest=dest, source="hub")
    if host.get_fact(DepotRef, store=store, repo_id=repo_id, revision=revision) != commit.sha:
        # After the fetch command: a failed verification stops the host before the ref moves.
        yield from files.put._inner(src=StringIO(commit.sha + "\n"),
                                    dest=ref_path(store, repo_id, revision),
                                    user="root", group="root", mode="644")


@deploy("Depot")
def serve():
    """The depot role: read-only account, then each model of depot_models, once, verified."""
    account()
    if depot_models(host.data):
        models._prepare("hub")
    store = host.data.depot_store
    for m in depot_models(host.data):
        models.check_args(m["repo_id"], m["revision"], m["include"], f"{store}/{m['repo_id']}")
        depot_model(name=f"Depot copy of {m['repo_id']}@{m['revision']}", store=store, **m)
