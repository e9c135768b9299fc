"""Operations of the model depot and of the nodes that copy from it.

The depot (deploys/depot.py) keeps one verified copy per model at {store}/<org>--<name>/<sha>/
and, in its state dir, which sha a revision designates. Nodes read those facts on the depot
host (it must be in the same inventory) and rsync from its read-only account.
"""

from __future__ import annotations

from dataclasses import dataclass

from gevent.lock import RLock
from pyinfra import host
from pyinfra.api import operation

from servefleet.core.errors import DataError
from servefleet.core.layout import NodeLayout
from servefleet.facts.depot import DepotRef, SshHostKey
from servefleet.operations.node import fail_host, upload


@dataclass(frozen=True)
class DepotHost:
    name: str
    host: object  # the depot's pyinfra Host (facts are read on it)
    address: str  # where nodes reach it (the private network)
    port: int
    user: str
    layout: NodeLayout


def locate(name: str) -> DepotHost:
    """The depot host by inventory name; DataError when it is not in this run's inventory."""
    depot = host.inventory.get_host(name, default=None)
    if depot is None:
        raise DataError(
            f"invalid data for host {host.name}: depot_host = {name!r} is not a host of this "
            "inventory (use one that holds the depot too, e.g. inventory/fleet.py with --limit); "
            "nothing was changed")
    data = depot.data
    return DepotHost(name=name, host=depot,
                     address=data.get("depot_address") or data.get("ssh_hostname") or name,
                     port=int(data.get("ssh_port") or 22), user=data.get("depot_user") or "sfdepot",
                     layout=NodeLayout.of(data))


# Nodes read facts on the depot from their own greenlets: one at a time, or two of them race to
# open the depot's SSH connection.
_depot_lock = RLock()


def depot_fact(where: DepotHost, cls, **kwargs):
    with _depot_lock:
        return where.host.get_fact(cls, **kwargs)


def ref_on_depot(where: DepotHost, repo_id: str, revision: str) -> str | None:
    return depot_fact(where, DepotRef, ref_file=where.layout.depot_ref(repo_id, revision))


@operation()
def known_hosts(path: str, depot_host: str):
    """
    Pin the depot's SSH host key, read from the depot itself, in a known_hosts file.

    + path: the known_hosts file to write
    + depot_host: the depot's inventory name

    **Example:**

    .. code:: python

        depot.known_hosts(path="/opt/servefleet/etc/depot-known-hosts", depot_host="depot-1")
    """
    where = locate(depot_host)
    key = depot_fact(where, SshHostKey)
    if not key:
        yield fail_host(f"cannot read the SSH host key of depot {where.name}")
        return
    name = where.address if where.port == 22 else f"[{where.address}]:{where.port}"
    yield from upload._inner(dest=path, content=f"{name} {key}\n", mode="644")
