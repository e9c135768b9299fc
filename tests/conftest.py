"""Shared fixtures. The e2e tier runs against the real testbed: its own instance, brought up
fresh once per session (whatever a demo or an earlier run left up is never reused)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Before anything imports the testbed: the tests' own instance (namespace, subnet, state), never
# the demo's (instance 0).
TEST_INSTANCE = os.environ.get("SERVEFLEET_TEST_INSTANCE", "7")
os.environ["SERVEFLEET_TESTBED_INSTANCE"] = TEST_INSTANCE

import pytest  # noqa: E402

from servefleet_dev.testbed import hosts as tb_hosts  # noqa: E402
from servefleet_dev.testbed import lifecycle  # noqa: E402
from servefleet_dev.testbed import net as tb_net  # noqa: E402
from servefleet_dev.testbed import state as tb_state  # noqa: E402
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
            inode = load_state().netns_inode
            lifecycle.down(log=log)
            left = leftovers(inode)
            if left:  # fails the session: a test started something that outlived it
                raise RuntimeError(f"still running after the testbed went down: {left}")


def leftovers(netns_inode) -> list[str]:
    """Processes of this testbed instance still alive: in its namespace, or running from or
    naming its tree."""
    tree = str(tb_state.testbed_dir()) + "/"
    found = [f"pid {p} (in the testbed's network namespace)"
             for p in tb_net.pids_in_netns({netns_inode} if netns_inode else set())]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            root = os.readlink(proc / "root")
        except OSError:
            continue
        if (tree in cmd or root.startswith(tree)) and tb_hosts.running(int(proc.name)):
            found.append(f"pid {proc.name}: {cmd[:200]}")
    return found


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


_PREFETCH: dict = {}


def pytest_collection_finish(session):
    """A session that runs the e2e tier before the unit tier: make the unit tier's big things
    in the background meanwhile (servefleet_dev.testing.prefetch; nice'd, same locks)."""
    tiers = {_tier(item.nodeid) for item in session.items}
    if {"e2e", "unit"} <= tiers and not os.environ.get("SERVEFLEET_NO_PREFETCH"):
        log = open(Path(session.config.rootpath) / ".pytest-prefetch.log", "w")
        _PREFETCH["proc"] = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "servefleet_dev.testing.prefetch"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        _PREFETCH["log"] = log


def pytest_sessionfinish(session):
    proc = _PREFETCH.get("proc")
    if proc and proc.poll() is None:  # the tests finished first (or were interrupted)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


TIERS = ("e2e", "hostile", "unit", "other")
_SESSION_START = time.monotonic()


def _tier(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "other"


def pytest_terminal_summary(terminalreporter):
    """Where the time went (per tier: setup + call + teardown of its tests) and the hostile-input
    suite's count: tried, handled, failed."""
    spent = dict.fromkeys(TIERS, 0.0)
    counted = dict.fromkeys(TIERS, 0)
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if hasattr(rep, "duration") and hasattr(rep, "nodeid") and hasattr(rep, "when"):
                spent[_tier(rep.nodeid)] += rep.duration
                counted[_tier(rep.nodeid)] += rep.when == "call"
    terminalreporter.write_sep("-", "time per tier")
    for tier in TIERS:
        if counted[tier] or spent[tier]:
            terminalreporter.write_line(f"{tier:8} {counted[tier]:5} tests  {spent[tier] / 60:6.1f} min")
    terminalreporter.write_line(f"{'session':8} {'':5}        "
                                f"{(time.monotonic() - _SESSION_START) / 60:6.1f} min (wall)")
    if _PREFETCH.get("log"):
        _PREFETCH["log"].flush()
        for line in Path(_PREFETCH["log"].name).read_text().splitlines():
            if line.startswith("prefetch: "):
                terminalreporter.write_line(line)
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
