"""Host-key checking switched off, wherever it is set: one warning per host, naming how.

pyinfra's SSH connector (paramiko, `pyinfra.connectors.sshuserclient`) decides from three
places, and so does this check, in pyinfra's order:
- the host's data, from any layer (fleet.yml, `--data`, an API caller's override data, a
  group_data file): `ssh_strict_host_key_checking` and `ssh_known_hosts_file`;
- the OpenSSH client config pyinfra reads: the file `ssh_config_file` names, else
  `~/.ssh/config` (pyinfra never reads /etc/ssh/ssh_config), looked up for `ssh_hostname` (else
  the host's name) as pyinfra looks it up: its `UserKnownHostsFile` applies unless the data
  sets `ssh_known_hosts_file`. Its `StrictHostKeyChecking` never applies: pyinfra 3.10 always
  passes `ssh_strict_host_key_checking` (its default accept-new; None is refused as not a str),
  and reads the config's only when that is None (tests/unit/test_inventory.py checks both).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from pyinfra.connectors.sshuserclient.client import get_ssh_config

# What pyinfra's connector (get_missing_host_key_policy) reads as "accept any key": no and off;
# the data's other spellings of false are warned too (a typo for yes is no better).
_OFF = ("no", "off", "false", "0", "")


def keeps_no_key(path) -> bool:
    """A known_hosts file that keeps nothing: empty, a device (/dev/null), /proc, no file."""
    text = str(path).strip()
    if text == "":
        return True
    p = Path(text).expanduser()
    return str(p).startswith(("/dev/", "/proc/")) or (p.exists() and not p.is_file())


def _ssh_config(data: Mapping, host_name: str) -> tuple[str, dict]:
    """(the file, its settings for this host) as pyinfra's connector reads them; {} when there
    is no such file or it cannot be parsed (pyinfra then fails to connect and says why)."""
    path = data.get("ssh_config_file") or os.path.expanduser("~/.ssh/config")
    try:
        config = get_ssh_config(str(path))
        return str(path), (
            dict(config.lookup(data.get("ssh_hostname") or host_name)) if config else {}
        )
    except Exception:  # noqa: BLE001 - paramiko's parse errors, an Include loop: not ours to report
        return str(path), {}


def checking_off(data: Mapping, host_name: str, source_of: Callable[[str], str]) -> list[str]:
    """Each way this host's SSH connection accepts any host key: "what (where)"."""
    found = []
    strict = data.get("ssh_strict_host_key_checking")
    if strict is not None and str(strict).strip().lower() in _OFF:
        found.append(
            f"ssh_strict_host_key_checking: {strict}, {source_of('ssh_strict_host_key_checking')}"
        )
    known = data.get("ssh_known_hosts_file")
    if known is not None and keeps_no_key(known):
        found.append(
            f"ssh_known_hosts_file: {known} (keeps no key), {source_of('ssh_known_hosts_file')}"
        )
    path, config = _ssh_config(data, host_name)
    files = str(config.get("userknownhostsfile") or "")
    if known is None and files and any(keeps_no_key(f) for f in files.split()):
        found.append(f"UserKnownHostsFile {files} (keeps no key), {path}")
    return found


_warned: set[str] = set()


def warn(host_name: str, data: Mapping, source_of: Callable[[str], str]) -> None:
    """One warning on stderr, once per host and process, when its host-key checking is off."""
    found = checking_off(data, host_name, source_of)
    if found and host_name not in _warned:
        _warned.add(host_name)
        print(
            f"servefleet: WARNING: SSH host-key checking is OFF for {host_name} "
            f"({'; '.join(found)}): anyone between you and it can impersonate the node. Pin "
            f"its key in ssh_known_hosts_file.",
            file=sys.stderr,
        )
