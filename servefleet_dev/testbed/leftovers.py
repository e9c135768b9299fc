"""What of this testbed instance is still there after `down`: the check that the test session
(tests/conftest.py) and benchmarks/testbed_fds.py fail on.

Guests are found by what they are, not by what the state file says: a process in the instance's
network namespace, or whose command line, root or guest overlay (a guest's own root reads `/`)
lies in the instance's tree; the instance's slirp4netns and hub by their command lines; then its
mounts, its namespace file and its routes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from servefleet_dev.testbed import hosts, net
from servefleet_dev.testbed.state import testbed_dir


def leftovers(netns_inode: int | None = None) -> list[str]:
    """One line per thing of this instance still alive or mounted; [] when nothing is.
    netns_inode: the instance's network namespace as it was while up (its file is gone after
    `down`, the processes in it need not be)."""
    tree = str(testbed_dir()) + "/"
    found = [
        f"pid {p} (in the testbed's network namespace)"
        for p in net.pids_in_netns({netns_inode} if netns_inode else set())
    ]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            root = os.readlink(proc / "root")
        except OSError:
            continue
        upper = hosts.guest_upper(int(proc.name)) or ""
        if tree in cmd or root.startswith(tree) or upper.startswith(tree):
            if hosts.running(int(proc.name)):
                found.append(
                    f"pid {proc.name}: {cmd[:200]}" + (f" (guest of {upper})" if upper else "")
                )
        elif "slirp4netns" in cmd and str(net.NETNS_PATH) in cmd:
            found.append(f"slirp4netns {proc.name}")
        elif "servefleet_dev.hub serve" in cmd and f"--host {net.HOST_ADDR} " in cmd:
            found.append(f"hub {proc.name}")
    with open("/proc/self/mounts") as fh:
        found += [f"mount {ln.split()[1]}" for ln in fh if ln.split()[1].startswith(tree)]
    if net.NETNS_PATH.exists():
        found.append(f"namespace {net.NETNS_PATH}")
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    found += [f"route {ln}" for ln in routes.splitlines() if str(net.SUBNET) in ln]
    return found
