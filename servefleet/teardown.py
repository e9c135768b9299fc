"""Remove what servefleet installed on a node (`servefleet rebuild`, deploys/teardown.py).

Stops and removes every servefleet-*.service unit and everything under the servefleet root but
the model store (unless purge_models): venvs, tools, builds, state, configuration.
"""

import shlex

from pyinfra import host
from pyinfra.api import FactBase, deploy
from pyinfra.operations import files, systemd


class ServefleetUnits(FactBase):
    """Unit files servefleet installed: /etc/systemd/system/servefleet-*.service."""

    default = list

    def command(self):
        return "ls -1 /etc/systemd/system/ | grep '^servefleet-.*\\.service$' || true"

    def process(self, output):
        return [line.strip() for line in output if line.strip()]


class DirEntries(FactBase):
    """Names directly under a directory ([] when it does not exist)."""

    default = list

    def command(self, path):
        return f"ls -1A {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return [line.strip() for line in output if line.strip()]


@deploy("Stop and remove servefleet services")
def remove_services():
    units = host.get_fact(ServefleetUnits)
    for unit in units:
        systemd.service(name=f"Stop {unit}", service=unit, running=False, enabled=False)
        files.file(name=f"Remove {unit}", path=f"/etc/systemd/system/{unit}", present=False)
    systemd.daemon_reload(name="Reload systemd", _if=lambda: bool(units))


@deploy("Remove the servefleet tree")
def remove_tree(purge_models: bool = False):
    root = host.data.servefleet_root
    for entry in host.get_fact(DirEntries, path=root):
        if entry == "models" and not purge_models:
            continue  # 69 GB is not worth fetching again: kept unless asked
        files.directory(name=f"Remove {root}/{entry}", path=f"{root}/{entry}", present=False)
