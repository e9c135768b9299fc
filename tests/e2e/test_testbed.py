"""The testbed itself: hosts are reached like a real fleet (a sudo user, pinned host keys, one
on port 2222); they come and go; an unclean stop recovers; `rm` and `down` stop exactly their
hosts, also among a dozen of similar names."""

import os
import shlex
import signal
import socket
import subprocess
import sys

import pytest

from servefleet.core import sandbox
from servefleet_dev.testbed import hosts, lifecycle, platforms, state as tb_state
from servefleet_dev.testbed.image import ADMIN_USER
from servefleet_dev.testbed.state import known_hosts_path, load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT

pytestmark = pytest.mark.e2e


def ssh(rec, *cmd, user="root"):
    return subprocess.run(
        [*hosts.ssh_args(rec, user), *cmd], capture_output=True, text=True, timeout=30
    )


def test_status_lists_every_host_running(testbed):
    rows = {r["name"]: r for r in lifecycle.status()}
    assert {"spark-1", "rtx4090-1", "depot-1"} <= set(rows)
    for row in rows.values():
        assert row["systemd"] == "running"
        assert row["role"] == row["name"].rsplit("-", 1)[0]


def test_hosts_are_reached_as_a_sudo_user_with_pinned_host_keys(testbed):
    spark, depot = testbed.hosts["spark-1"], testbed.hosts["depot-1"]
    assert depot.ssh_port == 2222 and spark.ssh_port == 22
    for rec in (spark, depot):
        who = ssh(rec, "id -un; sudo -n id -un", user=ADMIN_USER)
        assert who.returncode == 0 and who.stdout.split() == [ADMIN_USER, "root"], who.stderr
    # The known_hosts holds each guest's own key; a host presenting another key is refused.
    pinned = known_hosts_path().read_text()
    assert (
        f"[{depot.address}]:2222 ssh-ed25519 " in pinned
        and f"{spark.address} ssh-ed25519 " in pinned
    )
    original = pinned
    try:
        known_hosts_path().write_text(
            pinned.replace(f"{spark.address} ", f"{depot.address}x ").replace(
                f"[{depot.address}]:2222 ", f"{spark.address} "
            )
        )
        refused = ssh(spark, "true")
        assert refused.returncode != 0 and "host key" in refused.stderr.lower()
    finally:
        known_hosts_path().write_text(original)


def test_guests_reach_each_other_the_hub_and_the_registries(testbed):
    spark, depot = testbed.hosts["spark-1"], testbed.hosts["depot-1"]
    assert ssh(spark, "hostname").stdout.strip() == "spark-1"
    assert ssh(spark, "bash", "-c", f"exec 3<>/dev/tcp/{depot.address}/2222").returncode == 0
    hub = load_state().services["hub"]["url"]
    out = ssh(
        spark, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{hub}/_servefleet/health"
    )
    assert out.stdout == "200"
    # Outbound NAT: the Debian archive (a package registry) answers from inside a guest.
    out = ssh(
        spark,
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://deb.debian.org/debian/dists/bookworm/Release",
    )
    assert out.stdout == "200"


def test_add_and_rm_a_fresh_host(testbed):
    rec = lifecycle.add("spark-9", log=lambda m: None)
    try:
        assert ssh(rec, "systemctl", "is-system-running").stdout.strip() == "running"
        assert ssh(rec, "test", "-e", "/opt/servefleet").returncode == 1  # bare
    finally:
        lifecycle.rm("spark-9", log=lambda m: None)
    assert "spark-9" not in load_state().hosts
    with pytest.raises(OSError):
        socket.create_connection((rec.address, 22), timeout=1)
    assert not (tb_state.testbed_dir() / "hosts/spark-9").exists()
    assert rec.address not in known_hosts_path().read_text()


def test_bad_host_name_is_refused_before_anything_starts(testbed):
    with pytest.raises(ValueError, match="must start with a role"):
        lifecycle.add("gpu-1", log=lambda m: None)


def test_up_after_an_unclean_stop_recovers(testbed):
    # Kill every supervisor and guest as a crash would; `up` must bring the same hosts back,
    # at the same addresses, with their disks (what was deployed on them) kept.
    state = load_state()
    marker = "/root/sf-crash-marker"
    for rec in state.hosts.values():
        assert ssh(rec, "touch", marker).returncode == 0
        assert ssh(rec, "sync").returncode == 0
    for rec in state.hosts.values():
        os.kill(rec.pid, signal.SIGKILL)
    for rec in state.hosts.values():
        hosts.stop(rec.name, None, timeout=0)  # what a crash leaves: kill, no poweroff
        # ...and no guest outlives it: its systemd is not left running, reparented to PID 1.
        assert hosts.guests_under(tb_state.testbed_dir() / "hosts" / rec.name) == [], rec.name
    lifecycle.up(list(state.hosts), log=lambda m: None)
    after = load_state()
    assert {n: h.address for n, h in after.hosts.items()} == {
        n: h.address for n, h in state.hosts.items()
    }
    for row in lifecycle.status():
        # Booted to the end ("degraded" too: a hard kill can leave a guest unit failed, e.g.
        # systemd-sysusers after an interrupted write; that is the guest's, not the testbed's).
        assert row["systemd"] in ("running", "degraded"), row
        assert ssh(after.hosts[row["name"]], "test", "-e", marker).returncode == 0, row


SCALE = ["depot-1"] + [f"depot-{n}" for n in range(10, 20)] + ["spark-1"]  # 12 similar names


def test_rm_and_down_of_a_dozen_hosts_stop_exactly_theirs(testbed):
    """On a testbed instance of its own: `rm depot-1` leaves depot-10..19 running (their
    directories share its prefix), and `down` leaves no guest process, mount or address."""
    env = {**os.environ, "SERVEFLEET_TESTBED_INSTANCE": "8"}

    def tb(*args, timeout=600):
        return subprocess.run(
            [
                sys.executable,
                "-c",
                "from servefleet.cli import main; raise SystemExit(main())",
                "testbed",
                *args,
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    probe = (
        "from servefleet_dev.testbed import lifecycle, net, hosts, state; import json; "
        "print(json.dumps({'rows': lifecycle.status(), 'dir': str(state.testbed_dir()), "
        "'netns': str(net.NETNS_PATH), 'subnet': str(net.SUBNET)}))"
    )

    def look():
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env=env,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=300,
        )
        import json

        return json.loads(out.stdout)

    up = tb("down")
    up = tb("up", "--hosts", ",".join(SCALE))
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        assert sum(r["systemd"] == "running" for r in look()["rows"]) == len(SCALE)
        rm = tb("rm", "depot-1")
        assert rm.returncode == 0, rm.stderr[-2000:]
        rows = {r["name"]: r["systemd"] for r in look()["rows"]}
        assert "depot-1" not in rows
        assert all(rows[n] == "running" for n in SCALE if n != "depot-1"), rows
    finally:
        down = tb("down")
    assert down.returncode == 0, down.stderr[-2000:]
    info = look()
    assert info["rows"] == []
    with open("/proc/self/mounts") as fh:
        assert not [ln for ln in fh if ln.split()[1].startswith(info["dir"] + "/")]
    left = []
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                root = os.readlink(f"/proc/{proc}/root")
                cmd = open(f"/proc/{proc}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            upper = hosts.guest_upper(int(proc)) or ""  # a guest's root reads "/" from here
            if (
                root.startswith(info["dir"] + "/")
                or info["dir"] + "/" in cmd
                or upper.startswith(info["dir"] + "/")
            ):
                left.append(cmd or root)
    assert left == []
    assert not os.path.exists(info["netns"])
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    assert info["subnet"] not in routes


def assert_device_policy_enforced(rec):
    """The product's own sandbox, as its probe applies it before a restart, is denied a device
    the guest really has (EPERM: the device filter), and reaches it once that device is
    allowed."""
    assert ssh(rec, "test -c /dev/net/tun").returncode == 0  # nspawn gives every guest one
    # nspawn makes it root's only (0600): open to all, so the device list alone is in the way
    # (file modes are checked first, and would deny with EACCES before the device filter runs).
    assert ssh(rec, "chmod 0666 /dev/net/tun").returncode == 0
    opens = ["/bin/sh", "-c", ": <>/dev/net/tun && echo opened"]

    def probe(props):
        script = sandbox.probe_script(
            "devpolicy-check.service", ADMIN_USER, props, [], opens, gpu=False
        )
        return ssh(rec, f"sh -c {shlex.quote(script)}")

    try:
        shipped = sandbox.properties(["/tmp"], gpu=False, memory_deny_write_execute=True)
        assert ("DevicePolicy", "closed") in shipped
        denied = probe(shipped)
        assert denied.returncode == 1, denied.stdout + denied.stderr
        assert "Operation not permitted" in denied.stderr, denied.stderr  # EPERM: the filter
        allowed = probe([*shipped, ("DeviceAllow", "/dev/net/tun rw")])
        assert allowed.returncode == 0 and "opened" in allowed.stdout, (
            allowed.stdout + allowed.stderr
        )
    finally:
        ssh(rec, "chmod 0600 /dev/net/tun")


def test_guests_enforce_the_units_device_policy(testbed):
    """A guest's systemd enforces DevicePolicy=/DeviceAllow= (nspawn allows bpf(): hosts.
    DEVICE_POLICY_ARGS)."""
    assert_device_policy_enforced(testbed.hosts["rtx4090-1"])


# Issue #29's platforms, on this worker's instance: Debian 13 native, Debian 12 arm64 emulated.
TRIXIE, ARM64 = "rtx4090-7@trixie", "spark-7@bookworm-arm64"


def test_a_debian_13_guest_and_an_arm64_guest(testbed):
    """Each is the release and architecture its name asks for, booted to `running`, reached as
    the sudo admin with its pinned host key; the Debian 13 guest's systemd (257, under this
    machine's nspawn 252) enforces the units' device policy as Debian 12's does."""
    quiet = lambda m: None  # noqa: E731
    names = [platforms.parse(n).name for n in (TRIXIE, ARM64)]
    try:
        trixie, arm = (lifecycle.add(n, log=quiet) for n in (TRIXIE, ARM64))
        rows = {r["name"]: r for r in lifecycle.status()}
        assert (rows[trixie.name]["release"], rows[trixie.name]["arch"]) == ("trixie", "amd64")
        assert (rows[arm.name]["release"], rows[arm.name]["arch"]) == ("bookworm", "arm64")
        facts = "grep -E '^(VERSION_CODENAME|VERSION_ID)=' /etc/os-release; uname -m; hostname"
        assert ssh(trixie, facts).stdout.split() == [
            'VERSION_ID="13"',
            "VERSION_CODENAME=trixie",
            "x86_64",
            trixie.name,
        ]
        assert ssh(arm, facts).stdout.split() == [
            'VERSION_ID="12"',
            "VERSION_CODENAME=bookworm",
            "aarch64",
            arm.name,
        ]
        pinned = known_hosts_path().read_text()
        for rec in (trixie, arm):
            assert rows[rec.name]["systemd"] == "running", rows[rec.name]
            # The admin's login checks the guest's key against the one pinned at its creation.
            own = ssh(rec, "cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub").stdout.strip()
            assert f"{rec.address} {own}\n" in pinned
            who = ssh(rec, "id -un; sudo -n id -un", user=ADMIN_USER)
            assert who.returncode == 0 and who.stdout.split() == [ADMIN_USER, "root"], who.stderr
        assert_device_policy_enforced(trixie)
    finally:
        for name in names:
            if name in load_state().hosts:
                lifecycle.rm(name, log=quiet)
