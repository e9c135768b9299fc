"""The testbed's on-disk state: which hosts exist, their addresses, and the host-side services."""

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servefleet.core.paths import cache_subdir
from servefleet.fleet.registry import parse_role, role_names  # the roles: classes x engines
from servefleet_dev.testbed.platforms import DEFAULT_ARCH, DEFAULT_RELEASE


def instance() -> int:
    """Which testbed: $SERVEFLEET_TESTBED_INSTANCE (0 by default) lets several run side by side,
    each with its own namespace, subnet and state; the caches and base image are shared."""
    return int(os.environ.get("SERVEFLEET_TESTBED_INSTANCE") or 0)


def testbed_dir() -> Path:
    """This testbed's own files: state.json, per-host overlays, logs."""
    return cache_subdir("testbed" if instance() == 0 else f"testbed-{instance()}")


SHARED_CACHES = ("apt", "wheels", "uv", "pip", "ccache", "git", "hub", "src")


def common_dir() -> Path:
    """Shared by every testbed instance: base image, SSH key, host-side caches."""
    return cache_subdir("testbed")


def shared_dir() -> Path:
    """Host-side caches bind-mounted into every guest, so nothing big is fetched or built twice."""
    path = common_dir() / "shared"
    for name in SHARED_CACHES:
        (path / name).mkdir(parents=True, exist_ok=True)
    return path


def known_hosts_path() -> Path:
    """The testbed's known_hosts: every guest's host key, pinned when it is created."""
    return testbed_dir() / "known_hosts"


def state_path() -> Path:
    return testbed_dir() / "state.json"


@dataclass
class HostRecord:
    name: str
    role: str
    address: str
    pid: int | None = None  # the supervisor process that runs systemd-nspawn
    ssh_port: int = 22
    release: str = (
        DEFAULT_RELEASE  # Debian codename of its image (servefleet_dev.testbed.platforms)
    )
    arch: str = DEFAULT_ARCH  # Debian architecture of its image


@dataclass
class TestbedState:
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    services: dict[str, dict] = field(default_factory=dict)  # name -> {"url":..., "pid":...}
    network_up: bool = False
    netns_inode: int | None = None  # the namespace the guests live in (down finds them by it)

    def to_json(self) -> str:
        return json.dumps(
            {
                "hosts": {n: asdict(h) for n, h in self.hosts.items()},
                "services": self.services,
                "network_up": self.network_up,
                "netns_inode": self.netns_inode,
            },
            indent=2,
        )


def load_state() -> TestbedState:
    path = state_path()
    if not path.exists():
        return TestbedState()
    raw = json.loads(path.read_text())
    return TestbedState(
        hosts={n: HostRecord(**h) for n, h in raw.get("hosts", {}).items()},
        services=raw.get("services", {}),
        network_up=raw.get("network_up", False),
        netns_inode=raw.get("netns_inode"),
    )


def save_state(state: TestbedState) -> None:
    path = state_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, path)


@contextmanager
def locked():
    """Serialise testbed changes between concurrent commands (pytest and a shell, say)."""
    with open(testbed_dir() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def role_of(name: str) -> str:
    """A host's role is the prefix of its name: spark-1 -> spark, spark-llamacpp-1 ->
    spark-llamacpp (the node class spark serving with llama.cpp)."""
    role = name.rsplit("-", 1)[0] if "-" in name else name
    try:
        parse_role(role)
    except ValueError:
        raise ValueError(
            f"testbed host {name!r}: the name must start with a role ({', '.join(role_names())}) "
            f"followed by '-N', e.g. spark-1"
        ) from None
    return role
