"""The testbed itself: hosts come and go, an unclean stop recovers, `down` leaves nothing."""

import os
import signal
import socket
import subprocess

import pytest

from servefleet.testbed import hosts, lifecycle
from servefleet.testbed import state as tb_state
from servefleet.testbed.state import load_state

pytestmark = pytest.mark.e2e


def ssh(address, *cmd):
    return subprocess.run([*hosts.ssh_base_args(), f"root@{address}", *cmd],
                          capture_output=True, text=True, timeout=30)


def test_status_lists_every_host_running(testbed):
    rows = {r["name"]: r for r in lifecycle.status()}
    assert {"spark-1", "rtx4090-1", "depot-1"} <= set(rows)
    for row in rows.values():
        assert row["systemd"] == "running"
        assert row["role"] == row["name"].rsplit("-", 1)[0]


def test_guests_reach_each_other_the_hub_and_the_registries(testbed):
    spark, depot = testbed.hosts["spark-1"], testbed.hosts["depot-1"]
    assert ssh(spark.address, "hostname").stdout.strip() == "spark-1"
    assert ssh(spark.address, "bash", "-c", f"exec 3<>/dev/tcp/{depot.address}/22").returncode == 0
    hub = load_state().services["hub"]["url"]
    out = ssh(spark.address, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
              f"{hub}/_servefleet/health")
    assert out.stdout == "200"
    # Outbound NAT: the Debian archive (a package registry) answers from inside a guest.
    out = ssh(spark.address, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
              "http://deb.debian.org/debian/dists/bookworm/Release")
    assert out.stdout == "200"


def test_add_and_rm_a_fresh_host(testbed):
    rec = lifecycle.add("spark-9", log=lambda m: None)
    try:
        assert ssh(rec.address, "systemctl", "is-system-running").stdout.strip() == "running"
        assert ssh(rec.address, "test", "-e", "/opt/servefleet").returncode == 1  # bare
    finally:
        lifecycle.rm("spark-9", log=lambda m: None)
    assert "spark-9" not in load_state().hosts
    with pytest.raises(OSError):
        socket.create_connection((rec.address, 22), timeout=1)
    assert not (tb_state.testbed_dir() / "hosts/spark-9").exists()


def test_bad_host_name_is_refused_before_anything_starts(testbed):
    with pytest.raises(ValueError, match="must start with a role"):
        lifecycle.add("gpu-1", log=lambda m: None)


def test_up_after_an_unclean_stop_recovers(testbed):
    # Kill every supervisor and guest as a crash would; `up` must bring the same hosts back,
    # at the same addresses, with their disks (what was deployed on them) kept.
    state = load_state()
    marker = "/root/sf-crash-marker"
    for rec in state.hosts.values():
        assert ssh(rec.address, "touch", marker).returncode == 0
        assert ssh(rec.address, "sync").returncode == 0
    for rec in state.hosts.values():
        os.kill(rec.pid, signal.SIGKILL)
    for rec in state.hosts.values():
        hosts.stop(rec.name, None, timeout=0)  # what a crash leaves: kill, no poweroff
    lifecycle.up(list(state.hosts), log=lambda m: None)
    after = load_state()
    assert {n: h.address for n, h in after.hosts.items()} == \
        {n: h.address for n, h in state.hosts.items()}
    for row in lifecycle.status():
        # Booted to the end ("degraded" too: a hard kill can leave a guest unit failed, e.g.
        # systemd-sysusers after an interrupted write; that is the guest's, not the testbed's).
        assert row["systemd"] in ("running", "degraded"), row
        assert ssh(row["address"], "test", "-e", marker).returncode == 0, row
