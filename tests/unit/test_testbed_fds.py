"""The testbed holds a bounded number of file descriptors whatever the number of hosts: removing a
host's tree under gevent's patches, `down` when stopping the hosts fails half-way, and finding
each host's processes in one pass. Nothing here boots a guest: benchmarks/testbed_fds.py brings
50 up and down under a lowered open-files limit."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from servefleet_dev.testbed import hosts, lifecycle
from servefleet_dev.testbed.state import TestbedState, load_state, save_state
from servefleet_dev.testbed.trees import remove_tree

REMOVE_UNDER_GEVENT = textwrap.dedent(
    """
    import os, resource, sys
    from gevent import monkey
    monkey.patch_all()  # as pyinfra_cli does in every servefleet process
    import gevent
    gevent.sleep(0)  # the hub exists: gevent's os.close now defers what is not a regular file
    from servefleet_dev.testbed import hosts
    for h in range(3):
        for d in range(300):
            os.makedirs(hosts.hosts_dir() / f"depot-{h}" / "upper" / f"d{d}" / "x")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    for h in range(3):
        hosts.remove(f"depot-{h}")
    print(len(os.listdir("/proc/self/fd")), sorted(p.name for p in hosts.hosts_dir().iterdir()))
    """
)


def test_removing_hosts_trees_under_gevent_keeps_descriptors_bounded(tmp_path):
    # 3 hosts of 600 directories each, under a limit of 64 descriptors: shutil.rmtree, under
    # gevent's patched os.close, kept every directory open until the process next yielded.
    env = {**os.environ, "SERVEFLEET_CACHE": str(tmp_path), "SERVEFLEET_TESTBED_INSTANCE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", REMOVE_UNDER_GEVENT], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    fds, left = done.stdout.split(" ", 1)
    assert int(fds) < 20
    assert left.strip() == "[]"


def test_remove_tree_stays_on_its_filesystem_and_reports_when_asked(tmp_path):
    tree = tmp_path / "t"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "f").write_text("x")
    remove_tree(tree, check=True)
    assert not tree.exists()
    remove_tree(tmp_path / "absent", check=True)  # nothing to remove is no error
    done = subprocess.run(["rm", "--help"], capture_output=True, text=True)
    assert "--one-file-system" in done.stdout


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEFLEET_CACHE", str(tmp_path))
    monkeypatch.delenv("SERVEFLEET_TESTBED_INSTANCE", raising=False)
    return tmp_path


def test_down_takes_the_hub_and_network_even_when_stopping_hosts_fails(cache, monkeypatch):
    save_state(TestbedState(network_up=True))
    calls = []

    def fail(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(hosts, "stop_many", fail)
    monkeypatch.setattr(lifecycle.services, "stop_all", lambda state: calls.append("hub"))
    monkeypatch.setattr(lifecycle.net, "down", lambda: calls.append("network"))
    with pytest.raises(OSError, match="Too many open files"):
        lifecycle.down(log=lambda m: None)
    assert calls == ["hub", "network"]
    assert load_state().network_up  # not recorded as down: the next `down` finishes the hosts


def test_one_pass_over_proc_finds_each_hosts_processes(cache):
    base1, base10 = hosts.hosts_dir() / "depot-1", hosts.hosts_dir() / "depot-10"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    one = subprocess.Popen([*sleeper, f"{base1}/root"])
    ten = subprocess.Popen([*sleeper, f"{base10}/root"])
    try:
        want = {base1: [one.pid], base10: [ten.pid]}  # depot-1 is not depot-10
        deadline = time.monotonic() + 10
        # A process just started may be mid-exec for a moment (its /proc entries unreadable):
        # the scan is repeated as stop_many repeats it, until both are seen or time is up.
        while (found := hosts._procs_of_each([base1, base10])) != want:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert found == want
        t0 = time.monotonic()
        hosts.stop_many({"depot-1": one.pid, "depot-10": None}, timeout=5)
        assert one.wait(5) is not None and ten.wait(5) is not None  # SIGTERM, then SIGKILL
        assert time.monotonic() - t0 < 10
    finally:
        for p in (one, ten):
            p.kill()
            p.wait()


def test_boot_waits_for_a_bounded_number_of_hosts_at_once():
    assert 1 <= lifecycle.BOOT_WAITERS <= 32
