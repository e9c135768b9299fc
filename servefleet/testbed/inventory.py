"""pyinfra inventory of the testbed: its hosts by role, with SSH access and the local services."""

from servefleet.testbed import hosts
from servefleet.testbed.state import load_state


def role_hosts(role: str) -> list[tuple[str, dict]]:
    state = load_state()
    hub = state.services.get("hub", {})
    out = []
    for rec in state.hosts.values():
        if rec.role != role:
            continue
        data = {
            "ssh_hostname": rec.address,
            "ssh_user": "root",
            "ssh_key": str(hosts.ssh_key()),
            # Testbed hosts are recreated with new host keys: nothing to pin.
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "no",
            "testbed_address": rec.address,
        }
        if hub.get("url"):
            data["hf_endpoint"] = hub["url"]
        out.append((rec.name, data))
    return out
