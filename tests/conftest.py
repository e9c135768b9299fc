"""Shared fixtures. The e2e tier runs against the real testbed, brought up once per session."""

import os

import pytest

from servefleet.testbed import hosts as tb_hosts
from servefleet.testbed import lifecycle
from servefleet.testbed.state import load_state

SESSION_HOSTS = ["spark-1", "rtx4090-1", "depot-1"]


@pytest.fixture(scope="session")
def testbed():
    """The testbed's hosts, up for the whole session and always taken down afterwards."""
    lifecycle.up(SESSION_HOSTS, log=lambda m: print(f"[testbed] {m}"))
    try:
        yield load_state()
    finally:
        if not os.environ.get("SERVEFLEET_KEEP_TESTBED"):
            lifecycle.down(log=lambda m: print(f"[testbed] {m}"))


@pytest.fixture(scope="session")
def ssh_key(testbed):
    return str(tb_hosts.ssh_key())


def testinfra_host(address: str, key: str):
    import testinfra

    return testinfra.get_host(
        f"ssh://root@{address}", ssh_identity_file=key,
        ssh_extra_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                       "-o LogLevel=ERROR")


@pytest.fixture
def th(testbed, ssh_key):
    """testinfra host by testbed name: th('spark-1')."""
    return lambda name: testinfra_host(load_state().hosts[name].address, ssh_key)


@pytest.fixture
def fleet_file(testbed, ssh_key, tmp_path):
    """Write an operator-style fleet.yml for testbed hosts: {name: (role, data overrides)}."""
    import yaml

    def make(entries: dict) -> str:
        hosts = []
        for name, (role, data) in entries.items():
            hosts.append({"name": name, "role": role,
                          "ssh_hostname": load_state().hosts[name].address, "ssh_user": "root",
                          "ssh_key": ssh_key, "ssh_known_hosts_file": "/dev/null",
                          "ssh_strict_host_key_checking": "no", "data": data})
        path = tmp_path / "fleet.yml"
        path.write_text(yaml.safe_dump({"hosts": hosts}))
        return str(path)

    return make
