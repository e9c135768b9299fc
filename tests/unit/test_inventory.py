"""inventory/fleet.yml: valid files load into roles; malformed ones name file, entry, problem."""

import pytest

from servefleet.inventory import FleetError, load_fleet, role_hosts


def write(tmp_path, text):
    path = tmp_path / "fleet.yml"
    path.write_text(text)
    return path


def test_shipped_example_fleet_loads():
    hosts = load_fleet("inventory/fleet.yml")
    assert {h.role for h in hosts} == {"spark", "rtx4090"}
    spark = role_hosts("inventory/fleet.yml", "spark")
    assert spark[0][1]["_sudo"] is True


def test_overrides_and_ssh_keys_become_host_data(tmp_path):
    path = write(tmp_path, """
hosts:
  - {name: a, role: rtx4090, ssh_hostname: 10.1.1.1, ssh_port: 2222, data: {service_port: 9000}}
""")
    ((name, data),) = role_hosts(path, "rtx4090")
    assert name == "a" and data == {"ssh_hostname": "10.1.1.1", "ssh_port": 2222,
                                    "service_port": 9000}


@pytest.mark.parametrize("body,problem", [
    ("hosts:\n  - {name: a, role: gpu}", "hosts[0] (a): 'role' = 'gpu'"),
    ("hosts:\n  - {name: a, role: spark}\n  - {name: a, role: spark}", "hosts[1] (a): duplicate"),
    ("hosts:\n  - {name: a, role: spark, ssh_port: '22'}", "'ssh_port' = '22': expected int"),
    ("hosts:\n  - {name: a, role: spark, ssh_hostnme: x}", "unknown keys ['ssh_hostnme']"),
    ("hosts:\n  - {role: spark}", "hosts[0]: 'name' = None"),
    ("hosts: [1]", "hosts[0]: expected a mapping"),
    ("hosts:\n  - {name: a, role: spark, data: {ssh_user: x}}", "put connection keys"),
    ("hosts: [", "not valid YAML"),
])
def test_malformed_fleet_names_file_entry_and_problem(tmp_path, body, problem):
    path = write(tmp_path, body)
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    assert str(path) in str(err.value) and problem in str(err.value)
