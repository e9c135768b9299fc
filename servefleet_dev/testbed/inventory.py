"""pyinfra inventory of the testbed: its hosts by role, reached the way a real fleet is reached
(the non-root admin with sudo, strict host-key checking against the testbed's known_hosts, the
depot on port 2222), validated like the operator's fleet before anything connects."""

from __future__ import annotations

from servefleet.fleet.inventory import ROLES, InventoryHost, stop_on_bad_input, validate_hosts
from servefleet_dev.testbed import hosts
from servefleet_dev.testbed.image import ADMIN_USER
from servefleet_dev.testbed.state import known_hosts_path, load_state


def host_data(rec, hub_url: str | None) -> dict:
    data = {
        "ssh_hostname": rec.address,
        "ssh_port": rec.ssh_port,
        "ssh_user": ADMIN_USER,
        "ssh_key": str(hosts.ssh_key()),
        "ssh_known_hosts_file": str(known_hosts_path()),
        "ssh_strict_host_key_checking": "yes",
        "_sudo": True,
    }
    if hub_url:
        data["hf_endpoint"] = hub_url
    return data


def testbed_groups(inventory_file: str) -> list[list]:
    """[spark, rtx4090, depot, testbed_spark, testbed_rtx4090, testbed_depot] host lists.

    Group data applies in that order, then the file-name group `testbed` last:
    group_data/<role>.py  <  group_data/testbed_<role>.py  <  group_data/testbed.py
    """

    def build():
        state = load_state()
        hub = state.services.get("hub", {}).get("url")
        entries = [(rec, host_data(rec, hub)) for rec in state.hosts.values()]
        validate_hosts(
            [
                InventoryHost(
                    rec.name,
                    [rec.role, f"testbed_{rec.role}", "testbed"],
                    data,
                    f"the testbed's state ({rec.name})",
                )
                for rec, data in entries
            ]
        )
        by_role = [
            [(rec.name, data) for rec, data in entries if rec.role == role] for role in ROLES
        ]
        return by_role + by_role

    return stop_on_bad_input(build)
