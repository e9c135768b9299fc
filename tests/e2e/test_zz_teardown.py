"""Runs last in the e2e tier: `servefleet testbed down` leaves nothing behind."""

import os
import signal
import subprocess
from pathlib import Path

import pytest

from servefleet_dev.testbed import hosts, lifecycle, net, state as tb_state

pytestmark = pytest.mark.e2e


def test_down_ends_guests_whose_supervisor_died_and_whose_state_is_lost(testbed):
    """A guest whose supervisor was killed and which the state file no longer lists still
    lives in the testbed's namespace: `down` finds it there and ends it."""
    state = tb_state.load_state()
    rec = state.hosts["spark-1"]
    inode = net.netns_inode()
    assert inode and state.netns_inode == inode
    guests = net.pids_in_netns({inode})
    assert guests  # nspawn and the guests' systemd and services
    os.kill(rec.pid, signal.SIGKILL)  # the supervisor dies; its guest goes on
    del state.hosts["spark-1"]
    tb_state.save_state(state)  # and the state forgets it
    assert net.pids_in_netns({inode}), "the orphaned guest should still be running"
    assert lifecycle.status() and "spark-1" not in {r["name"] for r in lifecycle.status()}
    lifecycle.down(log=lambda m: None)
    assert not net.NETNS_PATH.exists()
    assert net.pids_in_netns({inode}) == []
    assert not [p for p in guests if hosts.running(p)]


def test_down_leaves_no_mounts_namespaces_processes_or_routes(testbed):
    lifecycle.down(log=lambda m: None)
    marker = str(tb_state.testbed_dir()) + "/"  # this instance's tree, not testbed-N's
    with open("/proc/self/mounts") as fh:
        assert not [ln for ln in fh if ln.split()[1].startswith(marker)]  # mount points
    assert not net.NETNS_PATH.exists()
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    assert str(net.SUBNET) not in routes
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert net.HOST_VETH not in links
    left = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if (
                marker in cmd
                or str(net.NETNS_PATH) + " " in cmd + " "
                or f"--host {net.HOST_ADDR} " in cmd + " "
            ):
                left.append(cmd)
    assert left == []
    assert tb_state.load_state().hosts == {} and not tb_state.load_state().network_up
