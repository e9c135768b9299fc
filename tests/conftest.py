"""Shared fixtures. The e2e tier runs against the real testbed: its own instance, brought up
fresh once per session (whatever a demo or an earlier run left up is never reused)."""

import os

# Before anything imports the testbed: the tests' own instance (namespace, subnet, state), never
# the demo's (instance 0).
TEST_INSTANCE = os.environ.get("SERVEFLEET_TEST_INSTANCE", "7")
os.environ["SERVEFLEET_TESTBED_INSTANCE"] = TEST_INSTANCE

import pytest  # noqa: E402

from servefleet_dev.testbed import hosts as tb_hosts  # noqa: E402
from servefleet_dev.testbed import lifecycle  # noqa: E402
from servefleet_dev.testbed.image import ADMIN_USER  # noqa: E402
from servefleet_dev.testbed.state import known_hosts_path, load_state  # noqa: E402

SESSION_HOSTS = ["spark-1", "rtx4090-1", "depot-1"]


@pytest.fixture(scope="session")
def testbed():
    """The session's hosts: a fresh testbed, taken down again afterwards."""
    log = lambda m: print(f"[testbed] {m}")  # noqa: E731
    lifecycle.down(log=log)  # hosts an earlier run left up are not fresh
    lifecycle.up(SESSION_HOSTS, log=log)
    try:
        yield load_state()
    finally:
        if not os.environ.get("SERVEFLEET_KEEP_TESTBED"):
            lifecycle.down(log=log)


@pytest.fixture(scope="session")
def ssh_key(testbed):
    return str(tb_hosts.ssh_key())


def testinfra_host(record, key: str, user: str = "root"):
    import testinfra

    return testinfra.get_host(
        f"ssh://{user}@{record.address}:{record.ssh_port}", ssh_identity_file=key,
        ssh_extra_args=f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts_path()} "
                       "-o LogLevel=ERROR")


@pytest.fixture
def th(testbed, ssh_key):
    """testinfra host by testbed name, as root (for inspection): th('spark-1')."""
    return lambda name: testinfra_host(load_state().hosts[name], ssh_key)


@pytest.fixture
def fleet_file(testbed, ssh_key, tmp_path):
    """Write an operator-style fleet.yml for testbed hosts: {name: (role, data overrides)},
    reached like a real fleet (the admin with sudo, pinned host keys)."""
    import yaml

    def make(entries: dict) -> str:
        hosts = []
        for name, (role, data) in entries.items():
            rec = load_state().hosts[name]
            hosts.append({"name": name, "role": role, "ssh_hostname": rec.address,
                          "ssh_port": rec.ssh_port, "ssh_user": ADMIN_USER, "sudo": True,
                          "ssh_key": ssh_key, "ssh_known_hosts_file": str(known_hosts_path()),
                          "data": data})
        path = tmp_path / "fleet.yml"
        path.write_text(yaml.safe_dump({"hosts": hosts}))
        return str(path)

    return make


def pytest_terminal_summary(terminalreporter):
    """The hostile-input suite's count: tried, handled, failed."""
    tried = handled = failed = 0
    for key in ("passed", "failed", "error"):
        for rep in terminalreporter.stats.get(key, []):
            if "test_hostile_input[" in getattr(rep, "nodeid", "") and rep.when == "call":
                tried += 1
                handled += key == "passed"
                failed += key != "passed"
    if tried:
        terminalreporter.write_line(f"hostile inputs: {tried} tried, {handled} handled, "
                                    f"{failed} failed")
