"""Remove what servefleet installed on a node (`servefleet rebuild`, deploys/teardown.py).

Stops and removes every servefleet-*.service unit and everything under the servefleet root
(venvs, tools, builds, state and its release records, configuration, secrets) except the model
revisions and, on a depot, its store; those go only with purge_models. Every delete is inside
the root or the models root, which the contract checks are dedicated directories.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.operations import files, server, systemd

from servefleet.core import node_output
from servefleet.core.layout import NodeLayout
from servefleet.core.validate import inside
from servefleet.facts.node import DirEntries
from servefleet.facts.systemd import ServefleetUnits
from servefleet.recipes import base
from servefleet.recipes.steps import deploy


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
    base.check_own_dirs()  # never delete in a directory that is not servefleet's
    # The root's marker stays: the converge after a rebuild knows the root as its own.
    keep = {lay.own_marker(lay.root)}
    if not purge_models:
        keep |= {lay.models_dir, lay.depot_dir}
    for entry in host.get_fact(DirEntries, path=lay.root):
        if node_output.shown(entry) != entry:  # no command can name it: every entry at once
            server.shell(
                name=f"Remove every entry of {lay.root} but the models",
                commands=[_remove_all_but(lay.root, keep)],
            )
            break
        path = f"{lay.root}/{entry}"
        if path in keep or any(inside(k, path) for k in keep):
            continue  # 69 GB is not worth fetching again: kept unless asked
        files.directory(name=f"Remove {path}", path=path, present=False)
    if lay.metrics_textfile:  # a torn-down node tells Prometheus nothing
        files.file(name=f"Remove {lay.metrics_textfile}", path=lay.metrics_textfile, present=False)
    if purge_models and not inside(lay.models_dir, lay.root):
        for entry in host.get_fact(DirEntries, path=lay.models_dir):
            if node_output.shown(entry) != entry:  # a name with bytes no command can name
                server.shell(
                    name=f"Remove every entry of {lay.models_dir}",
                    commands=[_remove_all_but(lay.models_dir, {lay.own_marker(lay.models_dir)})],
                )
                break
            if f"{lay.models_dir}/{entry}" == lay.own_marker(lay.models_dir):
                continue
            files.directory(
                name=f"Remove {lay.models_dir}/{entry}",
                path=f"{lay.models_dir}/{entry}",
                present=False,
            )


def _remove_all_but(directory: str, keep: set[str]) -> str:
    """Every entry directly under directory, whatever bytes its name holds, but the kept
    paths (find names them itself; nothing of theirs passes through a command line)."""
    q = shlex.quote
    children = {
        f"{directory}/{k[len(directory) + 1 :].split('/')[0]}"
        for k in keep
        if inside(k, directory) and k != directory
    }  # the entry that holds a kept path
    spared = " ".join(f"! -path {q(c)}" for c in sorted(children))
    return (
        f"find {q(directory)} -mindepth 1 -maxdepth 1 {spared} "
        "-exec rm -rf --one-file-system -- {} +"
    )
