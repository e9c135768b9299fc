"""One testbed guest: an overlayfs over the base image, seeded, booted with systemd-nspawn."""

import functools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from servefleet_dev.testbed import emulation, net
from servefleet_dev.testbed.image import ADMIN_UID, ADMIN_USER
from servefleet_dev.testbed.platforms import emulated
from servefleet_dev.testbed.state import (
    HostRecord,
    common_dir,
    instance,
    known_hosts_path,
    shared_dir,
    testbed_dir,
)
from servefleet_dev.testbed.trees import remove_tree
from servefleet_dev.testing.wheels import cache_lock

GUEST_CACHE = "/var/cache/servefleet"  # where the host-side caches appear inside every guest
# nspawn's default system-call filter refuses bpf(), and a guest's systemd then enforces no
# DevicePolicy=/DeviceAllow= at all, silently. Allowing it makes every guest enforce the units'
# device lists as a real node's systemd does (the GPU node on the H200 boots with it too:
# tests/device/gpunode.sh; ../shared/gpu-probe/h200-systemd/).
DEVICE_POLICY_ARGS = ("--system-call-filter=bpf",)
# The device filter is a cgroup-v2 BPF program: on a host that boots with the hybrid hierarchy
# (cgroup v1 controllers, cgroup2 at /sys/fs/cgroup/unified, as CI's machines do) nspawn would
# give the guest v1 too, read-only, and its systemd again enforces no device list. This makes
# every guest's systemd run on cgroup v2 whatever the host boots with.
DEVICE_POLICY_ENV = {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def hosts_dir() -> Path:
    path = testbed_dir() / "hosts"
    path.mkdir(exist_ok=True)
    return path


def _apt_cache(name: str) -> Path:
    path = shared_dir() / "apt" / f"{instance()}-{name}"
    (path / "partial").mkdir(parents=True, exist_ok=True)
    return path


def ssh_key() -> Path:
    """The testbed's own SSH key pair, made once."""
    key = common_dir() / "ssh" / "id_ed25519"
    if key.with_suffix(".pub").exists():
        return key
    with cache_lock("testbed-ssh-key"):  # testbeds brought up side by side make it once
        if not key.with_suffix(".pub").exists():
            key.parent.mkdir(mode=0o700, exist_ok=True)
            key.unlink(missing_ok=True)  # a half-made pair from an interrupted run
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "servefleet-testbed",
                    "-f",
                    str(key),
                ],
                check=True,
            )
    return key


def ssh_base_args(port: int = 22) -> list[str]:
    """ssh to a guest with its pinned host key (the testbed's known_hosts)."""
    options = (
        "StrictHostKeyChecking=yes",
        f"UserKnownHostsFile={known_hosts_path()}",
        "LogLevel=ERROR",
        "BatchMode=yes",
        "ConnectTimeout=5",
    )
    return ["ssh", "-i", str(ssh_key()), "-p", str(port), *(a for o in options for a in ("-o", o))]


def ssh_args(record: HostRecord, user: str = "root") -> list[str]:
    return [*ssh_base_args(record.ssh_port), f"{user}@{record.address}"]


def known_hosts_name(record: HostRecord) -> str:
    return record.address if record.ssh_port == 22 else f"[{record.address}]:{record.ssh_port}"


def pin_host_key(record: HostRecord) -> None:
    """Record the guest's own host key (made when it was seeded) in the testbed's known_hosts."""
    key = (hosts_dir() / record.name / "upper/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    forget_host_key(record)
    with open(known_hosts_path(), "a") as fh:
        fh.write(f"{known_hosts_name(record)} {key[0]} {key[1]}\n")


def forget_host_key(record: HostRecord) -> None:
    path = known_hosts_path()
    if path.exists():
        name = known_hosts_name(record)
        keep = [line for line in path.read_text().splitlines() if line.split(" ", 1)[0] != name]
        path.write_text("".join(f"{line}\n" for line in keep))


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _seed(upper: Path, name: str, address: str, ssh_port: int) -> None:
    """What makes this host itself before first boot: name, address, resolver, SSH port, host
    keys, the testbed key for root (the tests' inspection) and for the admin (servefleet's)."""
    _write(upper / "etc/hostname", f"{name}\n")
    _write(upper / "etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {name}\n")
    _write(upper / "etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
    _write(
        upper / "etc/systemd/network/10-host0.network",
        f"[Match]\nName=host0\n\n[Network]\nAddress={address}/{net.SUBNET.prefixlen}\n"
        f"Gateway={net.GATEWAY}\nDNS={net.SLIRP_DNS}\nLinkLocalAddressing=no\n",
    )
    resolv = upper / "etc/resolv.conf"
    if resolv.is_symlink():
        resolv.unlink()
    _write(resolv, f"nameserver {net.SLIRP_DNS}\n")
    (upper / "etc/ssh").mkdir(parents=True, exist_ok=True)
    # One host key, the ed25519 one the testbed pins (pin_host_key); `ssh-keygen -A` made an RSA
    # key too, most of a guest's seeding CPU (0.4 CPU-min a test run), for nothing to check it.
    key = upper / "etc/ssh/ssh_host_ed25519_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    _write(upper / "etc/ssh/sshd_config.d/hostkey.conf", f"HostKey /{key.relative_to(upper)}\n")
    if ssh_port != 22:
        _write(upper / "etc/ssh/sshd_config.d/port.conf", f"Port {ssh_port}\n")
    pub = Path(str(ssh_key()) + ".pub").read_text()
    (upper / "root/.ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
    _write(upper / "root/.ssh/authorized_keys", pub, 0o600)
    home = upper / "home" / ADMIN_USER
    (home / ".ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
    _write(home / ".ssh/authorized_keys", pub, 0o600)
    for path in (home, home / ".ssh", home / ".ssh/authorized_keys"):
        os.chown(path, ADMIN_UID, ADMIN_UID)


def _mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as fh:
        return any(line.split()[1] == target for line in fh)


def start(record: HostRecord, image: Path) -> int:
    """Mount the host's overlay (fresh upper on first start) and boot it; returns supervisor PID."""
    base = hosts_dir() / record.name
    upper, work, root = base / "upper", base / "work", base / "root"
    fresh = not upper.exists()
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    if fresh:
        _seed(upper, record.name, record.address, record.ssh_port)
        if emulated(record.arch):  # what qemu-user cannot do, worked around
            emulation.seed(upper, image)
    pin_host_key(record)
    if not _mounted(root):
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={image},upperdir={upper},workdir={work}",
                str(root),
            ],
            check=True,
        )
    shared = shared_dir()
    nspawn_args = [
        "-b",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={net.BRIDGE}",
        "--resolv-conf=off",
        "--timezone=off",
        "--console=passive",
        *DEVICE_POLICY_ARGS,
        f"--bind={shared}:{GUEST_CACHE}",
        # apt locks its archive dir, so each host name keeps its own (kept across re-creation).
        f"--bind={_apt_cache(record.name)}:/var/cache/apt/archives",
    ]
    # The supervisor writes the log; this process keeps no descriptor of it once started.
    with open(base / "console.log", "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servefleet_dev.testbed.supervise",
                record.name,
                str(root),
                "--",
                *nspawn_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            # A clean environment: guests must not inherit this shell's (slow) start-up or variables.
            env={
                "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                **DEVICE_POLICY_ENV,
                **{k: v for k, v in os.environ.items() if k.startswith("SERVEFLEET_")},
            },
        )
    return proc.pid


def wait_ready(record: HostRecord, timeout: float = 60) -> str:
    """Wait until sshd answers and systemd has finished booting; returns systemd's state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((record.address, record.ssh_port), timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    else:
        raise TimeoutError(
            f"testbed host {record.name} ({record.address}): no sshd after {timeout}s"
        )
    left = max(5, deadline - time.monotonic())
    out = subprocess.run(
        [*ssh_args(record), "timeout", str(int(left)), "systemctl", "is-system-running", "--wait"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or out.stderr.strip()


def restart_failed_units(record: HostRecord) -> list[str]:
    """The units that failed while the guest booted, restarted once (a boot beside a loaded
    test session can time a unit out); returns their names."""
    out = subprocess.run(
        [*ssh_args(record), "systemctl", "--failed", "--no-legend", "--plain"],
        capture_output=True,
        text=True,
    )
    failed = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    if failed:
        subprocess.run(
            [
                *ssh_args(record),
                "systemctl",
                "reset-failed",
                *failed,
                "&&",
                "systemctl",
                "restart",
                *failed,
            ],
            capture_output=True,
            text=True,
        )
    return failed


def system_state(record: HostRecord) -> str:
    out = subprocess.run(
        [*ssh_args(record), "systemctl", "is-system-running"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unreachable"


@functools.cache
def _own_pid_ns() -> str:
    return os.readlink("/proc/self/ns/pid")


def guest_upper(pid: int) -> str | None:
    """The overlay upper directory of the root a process runs in, when it is in a PID namespace
    of its own (a guest's): how a guest's processes are known from outside. Their root reads `/`
    and their command line is just systemd's; the mount table of their namespace names the
    upper directory, even after an earlier overlay of it was unmounted lazily."""
    try:
        if os.readlink(f"/proc/{pid}/ns/pid") == _own_pid_ns():
            return None
        with open(f"/proc/{pid}/mountinfo", "rb") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] == b"/" and b" - overlay " in line:
                    for opt in line.rsplit(b" ", 1)[-1].split(b","):
                        if opt.startswith(b"upperdir="):
                            return os.fsdecode(opt[len(b"upperdir=") :])
    except OSError:
        return None
    return None


def guests_under(prefix: Path) -> list[int]:
    """Every guest process whose overlay's upper directory is under prefix (a host's tree, or all
    of a testbed instance's), orphans of an earlier boot included."""
    top = str(prefix).rstrip("/") + "/"
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and (upper := guest_upper(int(proc.name))) and upper.startswith(top):
            pids.append(int(proc.name))
    return pids


def _procs_of_each(bases: list[Path]) -> dict[Path, list[int]]:
    """PIDs of the supervisor, nspawn and guest processes of each host tree in bases, from one
    pass over /proc: a process belongs to the tree at base when its root is exactly base/root,
    or it names base/root on its command line, or its guest overlay's upper directory is
    base/upper (depot-1 is not depot-10: whole path components only)."""
    roots = {f"{b}/root": b for b in bases}
    uppers = {f"{b}/upper": b for b in bases}
    argv_roots = {r.encode(): b for r, b in roots.items()}
    found: dict[Path, list[int]] = {b: [] for b in bases}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            proc_root = os.readlink(proc / "root")
        except OSError:
            continue
        base = next((argv_roots[a] for a in argv if a in argv_roots), None)
        if base is None:
            base = roots.get(proc_root) or next(
                (b for r, b in roots.items() if proc_root.startswith(r + "/")), None
            )
        if base is None:
            base = uppers.get(guest_upper(int(proc.name)) or "")
        if base is not None:
            found[base].append(int(proc.name))
    return found


def _procs_of(base: Path) -> list[int]:
    return _procs_of_each([base])[base]


def _mounts_under(base: Path) -> list[str]:
    prefix = str(base)
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _umount_under(base: Path) -> None:
    for point in sorted(_mounts_under(base), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def stop(name: str, pid: int | None, timeout: float = 15) -> None:
    """Power the guest off (SIGTERM to its supervisor), kill what is left, unmount."""
    stop_many({name: pid}, timeout)


def stop_many(hosts: dict[str, int | None], timeout: float = 15) -> None:
    """Power the guests off side by side (SIGTERM to each supervisor: {name: pid}), kill what
    is left of them after timeout, unmount their trees. One pass over /proc per poll serves
    them all, so stopping N hosts costs one poweroff's wait, not N."""
    bases = [hosts_dir() / name for name in hosts]
    for pid in hosts.values():
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    left = _procs_of_each(bases)
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _procs_of_each([b for b, pids in left.items() if pids])
    # What did not power off in time, the guest's own processes included: SIGKILL to nspawn
    # alone would leave the guest's systemd running, reparented to PID 1.
    kill_all([p for pids in _procs_of_each(bases).values() for p in pids])
    for base in bases:
        _umount_under(base)


def kill_all(pids: list[int], timeout: float = 10) -> None:
    """SIGKILL each process and wait until they are gone (a guest's init takes its whole PID
    namespace with it)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Not gone and not a zombie (a killed child of this process waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def remove(name: str) -> None:
    """Forget the host entirely: its upper dir is its disk."""
    base = hosts_dir() / name
    _umount_under(base)
    remove_tree(base)  # not shutil.rmtree: trees.py says why


def leftovers() -> list[Path]:
    return [p for p in hosts_dir().iterdir() if p.is_dir()]
