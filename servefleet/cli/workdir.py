"""A servefleet command on an inventory runs in the inventory's own project (core/project.py):
`servefleet status ~/fleet/inventory/spark.py` from any directory reads ~/fleet's fleet.yml,
group_data/ and files/, as `cd ~/fleet && servefleet status inventory/spark.py` does. The paths
on the command line (inventory, deploy, $SERVEFLEET_FLEET) are taken from where the command was
typed, and shown relative to the project as a run from there shows them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servefleet.core import project

FLEET_ENV = "SERVEFLEET_FLEET"


def _rebase(path: str, here: Path, root: Path) -> str:
    if not (here / path).exists() and (root / path).exists():
        return path  # written as from the project (deploys/base.py): read as such
    full = (here / path).resolve()
    try:
        return str(full.relative_to(root))
    except ValueError:  # outside the project: kept whole
        return str(full)


@contextmanager
def in_project(args) -> Iterator[Path | None]:
    """Run the command in its inventory's project when it was typed elsewhere (yields the
    project, or None when nothing moved); the directory and the environment are restored."""
    inventory = getattr(args, "inventory", None)
    root = project.root_of(inventory) if isinstance(inventory, str) else None
    here = Path.cwd()
    if root is None or root == here.resolve():
        yield None
        return
    saved_env = os.environ.get(FLEET_ENV)
    args.inventory = _rebase(inventory, here, root)  # type: ignore[arg-type]
    if isinstance(getattr(args, "deploy", None), str):
        args.deploy = _rebase(args.deploy, here, root)
    if saved_env:
        os.environ[FLEET_ENV] = str((here / saved_env).resolve())
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(here)
        if saved_env:
            os.environ[FLEET_ENV] = saved_env
