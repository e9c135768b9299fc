"""Remove what servefleet installed on a node (`servefleet rebuild`, deploys/teardown.py).

Stops and removes every servefleet-*.service unit and everything under the servefleet root
(venvs, tools, builds, state and its release records, configuration, secrets) except the model
revisions and, on a depot, its store; those go only with purge_models. Every delete is inside
the root or the models root, which the contract checks are dedicated directories.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from servefleet.core.validate import inside
from servefleet.core.layout import NodeLayout
from servefleet.facts.node import DirEntries
from servefleet.facts.systemd import ServefleetUnits
from servefleet.recipes import base


@deploy("Stop and remove servefleet services")
def remove_services():
    units = host.get_fact(ServefleetUnits)
    for unit in units:
        systemd.service(name=f"Stop {unit}", service=unit, running=False, enabled=False)
        files.file(name=f"Remove {unit}", path=NodeLayout.unit_path(unit), present=False)
    systemd.daemon_reload(name="Reload systemd", _if=lambda: bool(units))


@deploy("Remove the servefleet tree")
def remove_tree(purge_models: bool = False):
    lay = base.layout()
    keep = set() if purge_models else {lay.models_dir, lay.depot_dir}
    for entry in host.get_fact(DirEntries, path=lay.root):
        path = f"{lay.root}/{entry}"
        if path in keep or any(inside(k, path) for k in keep):
            continue  # 69 GB is not worth fetching again: kept unless asked
        files.directory(name=f"Remove {path}", path=path, present=False)
    if purge_models and not inside(lay.models_dir, lay.root):
        for entry in host.get_fact(DirEntries, path=lay.models_dir):
            files.directory(name=f"Remove {lay.models_dir}/{entry}",
                            path=f"{lay.models_dir}/{entry}", present=False)
