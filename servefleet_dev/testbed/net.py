"""The testbed's private network: a namespace holding a bridge, a veth to the host, and NAT.

Layout (nothing else on the host is touched but one route to the bridge subnet):

    host  sftb-h 10.77.254.1/30  ──veth──  sftb-n 10.77.254.2/30  [netns sf-testbed]
                                                 sfbr0 10.77.0.1/24  ── guests 10.77.0.10+
                                                 tap0 (slirp4netns) ── NAT to the registries

Host-side services (the local hub, ...) listen on 10.77.254.1, reachable from guests and the host.
"""

import ipaddress
import os
import signal
import subprocess
import time
from pathlib import Path

from servefleet_dev.testbed.state import instance

_I = instance()  # instance N uses 10.(77+N).x.x and names suffixed with N
NETNS = f"sf-testbed{_I or ''}"
BRIDGE = f"sfbr{_I}"
HOST_VETH = f"sftb{_I or ''}-h"
NS_VETH = f"sftb{_I or ''}-n"
SUBNET = ipaddress.ip_network(f"10.{77 + _I}.0.0/24")
GATEWAY = f"10.{77 + _I}.0.1"
HOST_ADDR = f"10.{77 + _I}.254.1"  # where host-side services listen
NS_ADDR = f"10.{77 + _I}.254.2"
LINK_PREFIX = 30
SLIRP_DNS = "10.0.2.3"
NETNS_PATH = Path("/run/netns") / NETNS


def _ip(*args, check=True, netns=False):
    cmd = ["ip", "-n", NETNS, *args] if netns else ["ip", *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def _in_ns(*cmd, check=True):
    return subprocess.run(
        ["ip", "netns", "exec", NETNS, *cmd], check=check, capture_output=True, text=True
    )


def host_address(index: int) -> str:
    return str(SUBNET.network_address + 10 + index)


def _subnet_taken_elsewhere() -> str | None:
    """A route to our subnet that is not ours means another network uses these addresses."""
    routes = _ip("-4", "route", "show", str(SUBNET)).stdout.strip()
    if routes and HOST_VETH not in routes:
        return routes
    return None


def netns_inode() -> int | None:
    """The inode of the testbed's network namespace (what /proc/PID/ns/net of every guest
    process names), None when it does not exist."""
    try:
        return NETNS_PATH.stat().st_ino
    except OSError:
        return None


def pids_in_netns(inodes: set[int]) -> list[int]:
    """Every process whose network namespace is one of `inodes`: the guests (their systemd and
    all below it) and the nspawn processes, whatever the state file says of them."""
    want = {f"net:[{i}]" for i in inodes}
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if os.readlink(proc / "ns" / "net") in want:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _slirp_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"slirp4netns") and str(NETNS_PATH).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def up() -> None:
    """Create the namespace, bridge, veth, route and NAT; idempotent."""
    taken = _subnet_taken_elsewhere()
    if taken:
        raise RuntimeError(f"testbed subnet {SUBNET} is already routed on this machine: {taken}")
    if not NETNS_PATH.exists():
        _ip("netns", "add", NETNS)
    _ip("link", "set", "lo", "up", netns=True)
    if _ip("link", "show", BRIDGE, netns=True, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge", netns=True)
        _ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE, netns=True)
    _ip("link", "set", BRIDGE, "up", netns=True)
    if _ip("link", "show", HOST_VETH, check=False).returncode != 0:
        _ip("link", "add", HOST_VETH, "type", "veth", "peer", "name", NS_VETH, "netns", NETNS)
        _ip("addr", "add", f"{HOST_ADDR}/{LINK_PREFIX}", "dev", HOST_VETH)
        _ip("addr", "add", f"{NS_ADDR}/{LINK_PREFIX}", "dev", NS_VETH, netns=True)
    _ip("link", "set", HOST_VETH, "up")
    _ip("link", "set", NS_VETH, "up", netns=True)
    _ip("route", "replace", str(SUBNET), "via", NS_ADDR, "dev", HOST_VETH)
    # Forwarding and NAT live inside the namespace only: the host's own settings stay as they are.
    _in_ns("sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
    if not _slirp_pids():
        subprocess.Popen(
            [
                "slirp4netns",
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--netns-type=path",
                str(NETNS_PATH),
                "tap0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(50):
            if _ip("link", "show", "tap0", netns=True, check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("slirp4netns did not bring up tap0 in the testbed namespace")
    rule = ["-s", str(SUBNET), "-o", "tap0", "-j", "MASQUERADE"]
    if _in_ns("iptables", "-t", "nat", "-C", "POSTROUTING", *rule, check=False).returncode != 0:
        _in_ns("iptables", "-t", "nat", "-A", "POSTROUTING", *rule)


def down() -> None:
    """Remove everything up() made; safe to call on a half-made or absent network."""
    for pid in _slirp_pids():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _ip("route", "del", str(SUBNET), "via", NS_ADDR, check=False)
    _ip("link", "del", HOST_VETH, check=False)
    if NETNS_PATH.exists():
        _ip("netns", "del", NETNS, check=False)
