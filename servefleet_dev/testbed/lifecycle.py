"""Bring the testbed up, add and remove hosts, report status, tear everything down."""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from servefleet.fleet.inventory import ROLES
from servefleet_dev.testbed import hosts, image, net, services
from servefleet_dev.testbed.state import (
    HostRecord,
    TestbedState,
    load_state,
    locked,
    role_of,
    save_state,
)

# The host's own tools the testbed drives, and the Debian packages that bring them.
HOST_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "systemd-nspawn": "systemd-container",
    "slirp4netns": "slirp4netns",
    "ip": "iproute2",
    "iptables": "iptables",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
}
DEFAULT_HOSTS = ("spark-1", "rtx4090-1", "depot-1")
# Real fleets move sshd off 22: the depots here do, so that path (and rsync over it) is tested.
SSH_PORTS = {"depot": 2222}


def mixed_names(n: int) -> list[str]:
    """n host names cycling through the roles: spark-1, rtx4090-1, depot-1, spark-2, ..."""
    return [f"{ROLES[i % len(ROLES)]}-{i // len(ROLES) + 1}" for i in range(n)]


def ensure_host_packages(log=print) -> None:
    """Install the host packages the testbed needs, on first use only."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if not shutil.which(tool)})
    if not missing:
        return
    log(f"installing host packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *missing],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


# Every guest's systemd holds dozens of inotify instances; the kernel default (128 per user,
# shared by all containers since they run as root here) runs out at ~4 hosts.
INOTIFY_LIMITS = {
    "/proc/sys/fs/inotify/max_user_instances": 8192,
    "/proc/sys/fs/inotify/max_user_watches": 1048576,
}


def ensure_inotify_limits(log=print) -> None:
    for path, want in INOTIFY_LIMITS.items():
        with open(path) as fh:
            have = int(fh.read())
        if have < want:
            log(f"raising {path.rsplit('/', 1)[-1]} from {have} to {want} for the guests' systemd")
            with open(path, "w") as fh:
                fh.write(str(want))


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _next_address(state: TestbedState) -> str:
    used = {h.address for h in state.hosts.values()}
    index = 0
    while net.host_address(index) in used:
        index += 1
    return net.host_address(index)


def _boot(state: TestbedState, names: list[str], log) -> None:
    img = image.base_image(log=log)
    started = []
    for name in names:
        rec = state.hosts.get(name)
        if rec is None:
            role = role_of(name)
            rec = HostRecord(
                name=name, role=role, address=_next_address(state), ssh_port=SSH_PORTS.get(role, 22)
            )
            state.hosts[name] = rec
        if not _alive(rec.pid):
            rec.pid = hosts.start(rec, img)
            started.append(rec)
    save_state(state)
    with ThreadPoolExecutor(max_workers=max(1, len(started))) as pool:
        for rec, sysstate in zip(started, pool.map(hosts.wait_ready, started), strict=False):
            if sysstate == "degraded":  # seen once in CI: a unit failed at boot, sshd with it
                failed = hosts.restart_failed_units(rec)
                sysstate = hosts.wait_ready(rec)
                log(
                    f"{rec.name}: {', '.join(failed) or 'no unit'} failed at boot, restarted: "
                    f"systemd {sysstate}"
                )
            if sysstate not in ("running", "degraded"):
                raise RuntimeError(f"testbed host {rec.name}: systemd is {sysstate!r}")
            log(f"{rec.name} ({rec.role}) {rec.address}: systemd {sysstate}")


def up(names=DEFAULT_HOSTS, log=print) -> TestbedState:
    """Start the network, the host-side services and the named hosts (others keep running)."""
    names = list(names)
    for name in names:
        role_of(name)  # validate every name before touching anything
    ensure_host_packages(log)
    ensure_inotify_limits(log)
    with locked():
        state = load_state()
        if state.network_up and not all(_alive(h.pid) for h in state.hosts.values()):
            # An unclean stop left a half testbed behind: clear it, keep the hosts' disks.
            log("recovering from an unclean stop")
            _teardown(state, keep_disks=True)
            state = load_state()
        net.up()
        state.network_up = True
        state.netns_inode = net.netns_inode()
        services.start_all(state, log)
        save_state(state)
        _boot(state, names, log)
        return state


def add(name: str, log=print) -> HostRecord:
    """Add one fresh host next to the running ones."""
    role_of(name)
    with locked():
        state = load_state()
        if not state.network_up:
            raise RuntimeError("the testbed is not up: run `servefleet testbed up` first")
        if name in state.hosts:
            raise ValueError(f"testbed host {name} already exists")
        hosts.remove(name)  # a stale disk from an earlier host of that name is not fresh
        ensure_inotify_limits(log)
        _boot(state, [name], log)
        return state.hosts[name]


def rm(name: str, log=print) -> None:
    with locked():
        state = load_state()
        rec = state.hosts.pop(name, None)
        if rec is None:
            raise ValueError(f"no testbed host named {name}")
        hosts.stop(name, rec.pid)
        hosts.remove(name)
        hosts.forget_host_key(rec)
        save_state(state)
        log(f"removed {name}")


def status() -> list[dict]:
    state = load_state()
    rows = []
    for rec in state.hosts.values():
        alive = _alive(rec.pid)
        rows.append(
            {
                "name": rec.name,
                "role": rec.role,
                "address": rec.address,
                "systemd": hosts.system_state(rec) if alive else "stopped",
            }
        )
    return rows


def _teardown(state: TestbedState, keep_disks: bool) -> None:
    for rec in state.hosts.values():
        hosts.stop(rec.name, rec.pid)
    # Every process left in the guests' network namespace, whether or not the state still lists
    # its host (a supervisor that died, a state file lost): their overlays cannot go before them.
    hosts.kill_all(net.pids_in_netns({i for i in (state.netns_inode, net.netns_inode()) if i}))
    for base in hosts.leftovers():  # also hosts the state file no longer knows about
        hosts.stop(base.name, None, timeout=0)
        if not keep_disks:
            hosts.remove(base.name)
    # Guests of this instance whose host tree is gone (orphans of an earlier run's down).
    hosts.kill_all(hosts.guests_under(hosts.hosts_dir()))
    services.stop_all(state)
    net.down()
    state.netns_inode = None
    for rec in state.hosts.values():
        rec.pid = None
    if not keep_disks:
        for rec in state.hosts.values():
            hosts.forget_host_key(rec)
        state.hosts.clear()
    state.network_up = False
    save_state(state)


def down(log=print) -> None:
    """Stop everything and leave nothing behind: processes, mounts, namespace, routes, disks."""
    with locked():
        _teardown(load_state(), keep_disks=False)
    log("testbed down")
