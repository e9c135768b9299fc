"""What a guest's systemd cannot do under qemu-user, and the seed that lets it boot anyway.

An emulated guest (arm64 here) runs every binary, systemd as PID 1 first, under Debian 12's
qemu-user-static 7.2, which refuses three things a bookworm systemd asks for (evidence.md,
Platforms: probes):
- clone() with namespace flags: systemd sets up a unit's credentials (LoadCredential= and kin) in
  a child cloned with CLONE_NEWNS, "Failed to fork off '(sd-mkdcreds)': Invalid argument", and the
  unit fails with 243/CREDENTIALS (systemd-sysctl, -sysusers, -tmpfiles-setup at boot; the
  llama.cpp unit too). Drop-ins clear those settings of the image's own units.
- netlink protocols but route, uevent and audit: systemd-networkd stops at "Could not setup
  manager: Protocol not supported". It is masked; a oneshot unit gives host0 the seeded address
  and route with `ip` (rtnetlink, which qemu-user translates).
- PR_SET_SECCOMP: systemd skips every seccomp-based setting ("SECCOMP features not detected in the
  kernel, skipping SystemCallFilter=", at debug level). Nothing works around that: an emulated
  guest proves an install path, not the sandbox.
"""

import re
from pathlib import Path

CREDENTIAL_KEY = re.compile(r"^((?:Load|Set|Import)Credential(?:Encrypted)?)=", re.MULTILINE)
NETWORKD_UNITS = (
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
)
NET_UNIT = "servefleet-testbed-net.service"
NET_SCRIPT = "/usr/local/sbin/servefleet-testbed-net"
# host0's address and gateway from the .network file every guest is seeded with (hosts._seed).
NET_SCRIPT_TEXT = """#!/bin/sh
set -eu
f=/etc/systemd/network/10-host0.network
ip link set host0 up
ip address replace "$(sed -n 's/^Address=//p' "$f")" dev host0
ip route replace default via "$(sed -n 's/^Gateway=//p' "$f")"
"""
NET_UNIT_TEXT = f"""[Unit]
Description=host0's address without systemd-networkd (qemu-user has no generic netlink)
Before=network.target network-online.target
Wants=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={NET_SCRIPT}

[Install]
WantedBy=multi-user.target network-online.target
"""


def credential_dropins(units: Path) -> dict[str, str]:
    """{unit name: drop-in} clearing each credential setting of the units in this directory."""
    dropins = {}
    for unit in sorted(units.glob("*.service")):
        keys = sorted(set(CREDENTIAL_KEY.findall(unit.read_text(errors="replace"))))
        if keys:
            dropins[unit.name] = "[Service]\n" + "".join(f"{key}=\n" for key in keys)
    return dropins


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def seed(upper: Path, image: Path) -> None:
    """Write the workarounds into a fresh emulated guest's upper directory."""
    etc = upper / "etc/systemd/system"
    for name, text in credential_dropins(image / "usr/lib/systemd/system").items():
        (etc / f"{name}.d").mkdir(parents=True, exist_ok=True)
        (etc / f"{name}.d/qemu-user.conf").write_text(text)
    for name in NETWORKD_UNITS:
        _link(etc / name, "/dev/null")
    script = upper / NET_SCRIPT.lstrip("/")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(NET_SCRIPT_TEXT)
    script.chmod(0o755)
    (etc / NET_UNIT).write_text(NET_UNIT_TEXT)
    for target in ("multi-user.target", "network-online.target"):
        _link(etc / f"{target}.wants" / NET_UNIT, f"/etc/systemd/system/{NET_UNIT}")
