"""Operations of the model depot and of the nodes that copy from it.

The depot (deploys/depot.py) keeps one verified copy per model at {store}/<org>--<name>/<sha>/
and, in its state dir, which sha a revision designates. Nodes read those facts on the depot
host (it must be in the same inventory) and rsync from its read-only account, checking the
depot's SSH host key against the key the operator pinned for it (its `ssh_known_hosts_file` in
fleet.yml, servefleet.core.known_hosts), never one read from the depot: a depot without a pinned
key stops the run before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gevent.lock import RLock
from pyinfra import host
from pyinfra.api import Host, operation

from servefleet.core.errors import DataError
from servefleet.core.known_hosts import PinError, host_name, pinned_keys
from servefleet.core.layout import NodeLayout
from servefleet.facts.depot import DepotRef
from servefleet.operations.files import upload


@dataclass(frozen=True)
class DepotHost:
    name: str
    host: Host  # the depot's pyinfra Host (facts are read on it)
    address: str  # where nodes reach it (the private network)
    port: int
    user: str
    layout: NodeLayout
    host_keys: tuple[str, ...]  # "keytype base64" the operator pinned for it

    @property
    def ssh_name(self) -> str:
        """The name nodes' ssh looks its key up by: address, or [address]:port."""
        return host_name(self.address, self.port)


def locate(name: str | None) -> DepotHost:
    """The depot host by inventory name, with the host keys the operator pinned for it.
    DataError (one line, nothing changed yet: recipes call this while the deploy is prepared)
    when it is not in this run's inventory or has no pinned key."""
    depot = None if name is None else host.inventory.get_host(name, default=None)
    if name is None or depot is None:
        raise DataError(
            f"invalid data for host {host.name}: depot_host = {name!r} is not a host of this "
            "inventory (use one that holds that host too, e.g. inventory/fleet.py with --limit); "
            "nothing was changed"
        )
    data = depot.data
    address = data.get("depot_address") or data.get("ssh_hostname") or name
    port = int(data.get("ssh_port") or 22)
    return DepotHost(
        name=name,
        host=depot,
        address=address,
        port=port,
        user=data.get("depot_user") or "sfdepot",
        layout=NodeLayout.of(data),
        host_keys=pinned(name, data, address, port),
    )


def pinned(name: str, data, address: str, port: int) -> tuple[str, ...]:
    """The depot's host keys from the operator's data: its ssh_known_hosts_file's entries for
    the address nodes reach it at and for the one the operator connects to (one machine). Only under ssh_strict_host_key_checking "yes": under accept-new or ask
    (pyinfra's default) pyinfra appends a key it has not seen to that very file, so an entry
    there may have been learned on first use, not pinned."""
    names = [host_name(address, port), host_name(data.get("ssh_hostname") or name, port)]
    try:
        keys = pinned_keys(data.get("ssh_known_hosts_file"), names)
        strict = data.get("ssh_strict_host_key_checking")
        if str(strict).strip().lower() != "yes":
            setting = "not set" if strict is None else repr(strict)
            raise PinError(
                f"its ssh_strict_host_key_checking is {setting}, under which pyinfra "
                f"adds a key it has not seen to that file (learned, not pinned)"
            )
    except PinError as exc:
        raise DataError(
            f"invalid data for host {host.name}: depot_host {name} has no pinned SSH host key ({exc}); "
            f"nodes trust only the key the operator pinned: in {name}'s fleet.yml entry set "
            f"ssh_known_hosts_file to a file holding its key for {names[0]} (checked out of "
            f"band) and ssh_strict_host_key_checking: yes; nothing was changed"
        ) from None
    return keys


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
    Pin the depot's SSH host key in a known_hosts file: the keys the operator pinned for the
    depot (its ``ssh_known_hosts_file``), under the name nodes reach it by.

    + path: the known_hosts file to write
    + depot_host: the depot's inventory name

    Not the key the depot shows: read over the operator's connection, that would be learned,
    not pinned. A depot whose key changed fails the nodes' copy (their ssh checks strictly) and
    the operator's own connection to it, until the operator pins the new key.

    **Example:**

    .. code:: python

        depot.known_hosts(path="/opt/servefleet/etc/depot-known-hosts", depot_host="depot-1")
    """
    where = locate(depot_host)
    content = "".join(f"{where.ssh_name} {key}\n" for key in where.host_keys)
    yield from upload._inner(dest=path, content=content, mode="644")
