"""`servefleet testbed fleet`: the running testbed's hosts as inventory/fleet.yml entries, so that
README's first-node steps can be rehearsed through fleet.yml exactly as written.

Each entry is what a real node's is (name, role, `engine:` where not the class's own, the
address, the sudo user, the key, the pinned known_hosts, strict host-key checking) plus
`testbed: true`, which puts the host in the testbed's groups as inventory/testbed.py does: the
testbed's data (group_data/testbed_<class>.py, testbed_<engine>.py, testbed.py: no GPU, the
wheelhouse, the vLLM stand-in, the tiny models) applies from its own files, nothing copied.
`data:` holds what no file has: the testbed hub's URL (`hf_endpoint`) and, on a native guest,
the architecture it has (`expected_arch`: testbed.inventory.host_data). A host's
merged data is the same through the written file as through inventory/testbed.py
(tests/unit/test_testbed_fleet.py), so a node converged either way is the same node.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import yaml

from servefleet.fleet.inventory import TESTBED
from servefleet.fleet.registry import parse_role
from servefleet_dev.testbed.inventory import host_data
from servefleet_dev.testbed.state import TestbedState, instance

HEADER = "# Written by `servefleet testbed fleet`"


def entries(state: TestbedState) -> list[dict]:
    """fleet.yml's `hosts:` for the testbed's hosts, in the state's order."""
    hub = state.services.get("hub", {}).get("url")
    out = []
    for rec in state.hosts.values():
        cls, engine = parse_role(rec.role)
        data = host_data(rec, hub)  # the testbed inventory's own host data, nothing else
        entry: dict = {"name": rec.name, "role": cls.name}
        if engine is not None and engine.name != cls.engine:
            entry["engine"] = engine.name
        entry.update({k: v for k, v in data.items() if k.startswith("ssh_")})
        entry["sudo"] = data["_sudo"]
        entry[TESTBED] = True
        rest = {k: v for k, v in data.items() if not k.startswith(("ssh_", "_"))}
        if rest:
            entry["data"] = rest
        out.append(entry)
    return out


def render(state: TestbedState, path: Path | None = None) -> str:
    """The whole file: a header saying what it is and how to use it, then the entries."""
    n = instance()
    where = shlex.quote(str(path.resolve())) if path else "<this file>"
    header = f"""{HEADER} for testbed instance {n}.
# Its hosts as fleet.yml entries, reached as a real node is: the sudo user, the testbed's key,
# the host keys pinned in its known_hosts. `testbed: true` applies the testbed's group_data
# (testbed_<class>.py, testbed_<engine>.py, testbed.py: no GPU, the wheelhouse, the vLLM
# stand-in, the tiny models); `data:` holds the testbed hub's URL and the architecture of a
# guest that runs natively (a spark host on x86_64). Rehearse README's
# "Your first real node" with it (docs/testbed.md):
#   export SERVEFLEET_FLEET={where}
# Written again by the same command after `servefleet testbed up` (addresses may change).
"""
    body = yaml.safe_dump({"hosts": entries(state)}, sort_keys=False, default_flow_style=False)
    return header + body


def write(path: Path, text: str) -> None:
    """Write the file, replacing only one this command wrote (never an operator's own fleet)."""
    if path.exists() or path.is_symlink():
        try:
            first = path.read_text(errors="replace").split("\n", 1)[0]
        except OSError as exc:
            raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
        if not path.is_file() or not first.startswith(HEADER):
            raise ValueError(
                f"{path}: exists and was not written by `servefleet testbed fleet`; "
                f"expected a new path (your own fleet.yml is never replaced)"
            )
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise ValueError(f"{path}: cannot be written ({exc.strerror})") from None
