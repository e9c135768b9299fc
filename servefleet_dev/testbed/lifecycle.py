"""Bring the testbed up, add and remove hosts, report status, tear everything down."""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from servefleet.fleet.inventory import ROLES
from servefleet_dev.testbed import binfmt, hosts, image, net, platforms, services
from servefleet_dev.testbed.platforms import HostSpec, emulated, label
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
    "qemu-aarch64-static": "qemu-user-static",  # arm64 guests (servefleet_dev.testbed.binfmt)
}
DEFAULT_HOSTS = ("spark-1", "rtx4090-1", "depot-1")
# Real fleets move sshd off 22: the depots here do, so that path (and rsync over it) is tested.
SSH_PORTS = {"depot": 2222}


# How long a guest may take to boot until sshd answers and systemd is up: an emulated one runs
# systemd, sshd and every unit under qemu-user, many times slower (evidence.md, Platforms: probes).
BOOT_TIMEOUT_S = {False: 60, True: 600}


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


def _specs(names) -> list[HostSpec]:
    """Parse and validate every name (`spark-1`, `spark-1@trixie-arm64`) before anything starts."""
    specs = [platforms.parse(n) for n in names]
    for spec in specs:
        role_of(spec.name)
    return specs


def _check_platforms(state: TestbedState, specs: list[HostSpec]) -> None:
    """A host keeps the release and architecture it was created with: a name without a suffix
    means the recorded one, a suffix naming another is refused (rm the host first)."""
    for spec in specs:
        rec = state.hosts.get(spec.name)
        if rec and (spec.release or rec.release, spec.arch or rec.arch) != (rec.release, rec.arch):
            raise ValueError(
                f"testbed host {spec.name} exists as {label(rec.release, rec.arch)}, not "
                f"{label(spec.release or rec.release, spec.arch or rec.arch)}: rm it first"
            )


def _boot(state: TestbedState, specs: list[HostSpec], log) -> None:
    _check_platforms(state, specs)
    to_start = []
    for spec in specs:
        rec = state.hosts.get(spec.name)
        if rec is None:
            role = role_of(spec.name)
            rec = HostRecord(
                name=spec.name,
                role=role,
                address=_next_address(state),
                ssh_port=SSH_PORTS.get(role, 22),
                release=spec.release or platforms.DEFAULT_RELEASE,
                arch=spec.arch or platforms.DEFAULT_ARCH,
            )
            state.hosts[spec.name] = rec
        if not _alive(rec.pid):
            to_start.append(rec)
    # Every image first (built once per release and architecture), then the guests side by side.
    images = {}
    for rec in to_start:
        if (rec.release, rec.arch) not in images:
            if emulated(rec.arch):  # the guest's own binaries run through it, PID 1 first
                binfmt.ensure(rec.arch, log)
            images[rec.release, rec.arch] = image.base_image(rec.release, rec.arch, log=log)
    for rec in to_start:
        rec.pid = hosts.start(rec, images[rec.release, rec.arch])
    save_state(state)
    with ThreadPoolExecutor(max_workers=max(1, len(to_start))) as pool:
        ready = pool.map(lambda r: hosts.wait_ready(r, BOOT_TIMEOUT_S[emulated(r.arch)]), to_start)
        for rec, sysstate in zip(to_start, ready, strict=False):
            if sysstate == "degraded":  # seen once in CI: a unit failed at boot, sshd with it
                failed = hosts.restart_failed_units(rec)
                sysstate = hosts.wait_ready(rec, BOOT_TIMEOUT_S[emulated(rec.arch)])
                log(
                    f"{rec.name}: {', '.join(failed) or 'no unit'} failed at boot, restarted: "
                    f"systemd {sysstate}"
                )
            if sysstate not in ("running", "degraded"):
                raise RuntimeError(f"testbed host {rec.name}: systemd is {sysstate!r}")
            log(
                f"{rec.name} ({rec.role}, {label(rec.release, rec.arch)}) {rec.address}: "
                f"systemd {sysstate}"
            )


def up(names=DEFAULT_HOSTS, log=print) -> TestbedState:
    """Start the network, the host-side services and the named hosts (others keep running)."""
    specs = _specs(names)  # every name valid before anything is touched
    ensure_host_packages(log)
    ensure_inotify_limits(log)
    with locked():
        state = load_state()
        _check_platforms(state, specs)
        if state.network_up and any(h.pid and not _alive(h.pid) for h in state.hosts.values()):
            # An unclean stop left a half testbed behind: clear it, keep the hosts' disks. (A
            # host `stop` powered off has no supervisor on record: it is only booted again.)
            log("recovering from an unclean stop")
            _teardown(state, keep_disks=True)
            state = load_state()
        net.up()
        state.network_up = True
        state.netns_inode = net.netns_inode()
        services.start_all(state, log)
        save_state(state)
        _boot(state, specs, log)
        return state


def add(name: str, log=print) -> HostRecord:
    """Add one fresh host next to the running ones (`spark-9`, `spark-9@trixie-arm64`)."""
    (spec,) = _specs([name])
    name = spec.name
    with locked():
        state = load_state()
        if not state.network_up:
            raise RuntimeError("the testbed is not up: run `servefleet testbed up` first")
        if name in state.hosts:
            raise ValueError(f"testbed host {name} already exists")
        hosts.remove(name)  # a stale disk from an earlier host of that name is not fresh
        ensure_inotify_limits(log)
        _boot(state, [spec], log)
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


def stop(name: str, log=print) -> None:
    """Power one host off, as a machine that goes down: its disk and address are kept, the
    others run on; `start` (or `up`) boots it again."""
    with locked():
        state = load_state()
        rec = state.hosts.get(name)
        if rec is None:
            raise ValueError(f"no testbed host named {name}")
        hosts.stop(name, rec.pid)
        rec.pid = None
        save_state(state)
    log(f"stopped {name}")


def start(name: str, log=print) -> HostRecord:
    """Boot a host that `stop` powered off (a running one is left as it is)."""
    with locked():
        state = load_state()
        if not state.network_up:
            raise RuntimeError("the testbed is not up: run `servefleet testbed up` first")
        if name not in state.hosts:
            raise ValueError(f"no testbed host named {name}")
        _boot(state, [HostSpec(name)], log)  # with the release and arch it was created with
        return state.hosts[name]


def status() -> list[dict]:
    state = load_state()
    rows = []
    for rec in state.hosts.values():
        alive = _alive(rec.pid)
        rows.append(
            {
                "name": rec.name,
                "role": rec.role,
                "release": rec.release,
                "arch": rec.arch,
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
