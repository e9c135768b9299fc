"""pyinfra inventory of the testbed: its hosts by role, reached the way a real fleet is reached
(the non-root admin with sudo, strict host-key checking against the testbed's known_hosts, the
depot on port 2222), validated like the operator's fleet before anything connects."""

from __future__ import annotations

from servefleet.fleet.inventory import (
    TESTBED_GROUPS,
    InventoryHost,
    group_lists,
    groups_of,
    stop_on_bad_input,
    testbed_groups_of,
    validate_hosts,
)
from servefleet.fleet.registry import parse_role
from servefleet_dev.testbed import hosts
from servefleet_dev.testbed.image import ADMIN_USER
from servefleet_dev.testbed.platforms import ARCHES, emulated
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
    if not emulated(rec.arch):
        # A native guest has this machine's architecture whatever node class it stands in for
        # (a spark host on x86_64): its preflight checks that. An emulated guest has the one its
        # class is built for (arm64 for the Spark), so the class's expected_arch applies as is.
        data["expected_arch"] = ARCHES[rec.arch]
    if hub_url:
        data["hf_endpoint"] = hub_url
    return data


def testbed_groups(inventory_file: str) -> dict[str, list]:
    """The testbed's hosts as pyinfra groups: each host's role (its name's prefix, e.g.
    spark-llamacpp) is a node class and an engine; group data applies in that order, then the
    testbed's files, then the file-name group `testbed` last:
    group_data/<class>.py < <engine>.py < testbed_<class>.py < testbed_<engine>.py < testbed.py
    """

    def build():
        state = load_state()
        hub = state.services.get("hub", {}).get("url")
        entries, groups = [], []
        for rec in state.hosts.values():
            cls, engine = parse_role(rec.role)
            served = engine.name if engine else None
            entries.append((rec.name, host_data(rec, hub)))
            groups.append(groups_of(cls.name, served, *testbed_groups_of(cls.name, served)))
        validate_hosts(
            [
                InventoryHost(name, gs, data, f"the testbed's state ({name})")
                for (name, data), gs in zip(entries, groups, strict=True)
            ]
        )
        return group_lists(entries, groups, after=TESTBED_GROUPS)

    return stop_on_bad_input(build)
