"""The operator's fleet file (inventory/fleet.yml): hosts, their role, SSH access, overrides.

The inventory/*.py files turn it into pyinfra groups named after the roles. A malformed file
stops pyinfra before it connects anywhere, with the file, the entry and the problem named.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROLES = ("spark", "rtx4090", "depot")
# pyinfra's own SSH connector keys, as the operator writes them in fleet.yml.
SSH_KEYS = {"ssh_hostname": str, "ssh_user": str, "ssh_port": int, "ssh_key": str,
            "ssh_known_hosts_file": str, "ssh_strict_host_key_checking": str}
ENTRY_KEYS = {"name", "role", "sudo", "data", *SSH_KEYS}


class FleetError(ValueError):
    """fleet.yml is malformed; the message names the file, the entry and the problem."""


@dataclass
class FleetHost:
    name: str
    role: str
    data: dict = field(default_factory=dict)  # pyinfra host data: ssh_* keys + overrides


def _fail(path, where, problem):
    raise FleetError(f"{path}: {where}: {problem}")


def load_fleet(path: str | Path) -> list[FleetHost]:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"{path}: not found (copy inventory/fleet.example.yml and edit it)")
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML: {exc}")
    if raw is None:
        return []
    if not isinstance(raw, dict) or not isinstance(raw.get("hosts", []), list):
        _fail(path, "top level", "expected a mapping with a 'hosts' list")
    hosts, seen = [], set()
    for i, entry in enumerate(raw.get("hosts") or []):
        where = f"hosts[{i}]"
        if not isinstance(entry, dict):
            _fail(path, where, f"expected a mapping, got {type(entry).__name__}")
        name = entry.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            _fail(path, where, f"'name' = {name!r}: expected a host name (letters, digits, . _ -)")
        where = f"hosts[{i}] ({name})"
        if name in seen:
            _fail(path, where, "duplicate name")
        seen.add(name)
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            _fail(path, where, f"unknown keys {unknown}; allowed: {sorted(ENTRY_KEYS)}")
        role = entry.get("role")
        if role not in ROLES:
            _fail(path, where, f"'role' = {role!r}: expected one of {', '.join(ROLES)}")
        data = {}
        for key, typ in SSH_KEYS.items():
            if key in entry:
                if not isinstance(entry[key], typ) or isinstance(entry[key], bool):
                    _fail(path, where, f"{key!r} = {entry[key]!r}: expected {typ.__name__}")
                data[key] = entry[key]
        if "ssh_key" in data:
            data["ssh_key"] = str(Path(data["ssh_key"]).expanduser())
        if "ssh_port" in data and not 0 < data["ssh_port"] < 65536:
            _fail(path, where, f"'ssh_port' = {data['ssh_port']}: expected 1-65535")
        if "sudo" in entry:
            if not isinstance(entry["sudo"], bool):
                _fail(path, where, f"'sudo' = {entry['sudo']!r}: expected true or false")
            data["_sudo"] = entry["sudo"]
        overrides = entry.get("data") or {}
        if not isinstance(overrides, dict):
            _fail(path, where, f"'data' is {type(overrides).__name__}: expected a mapping")
        clash = sorted(set(overrides) & (set(SSH_KEYS) | {"_sudo"}))
        if clash:
            _fail(path, where, f"'data' sets {clash}: put connection keys at the entry's top level")
        data.update(overrides)
        hosts.append(FleetHost(name=name, role=role, data=data))
    return hosts


def role_hosts(path: str | Path, role: str) -> list[tuple[str, dict]]:
    """The (name, data) pairs of one role, as pyinfra inventory files expect them."""
    return [(h.name, h.data) for h in load_fleet(path) if h.role == role]


def fleet_path() -> Path:
    """inventory/fleet.yml, or $SERVEFLEET_FLEET to point at another file."""
    import os
    return Path(os.environ.get("SERVEFLEET_FLEET") or Path("inventory") / "fleet.yml")
