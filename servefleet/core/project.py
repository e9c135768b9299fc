"""Where the operator's project is: the repository that holds group_data/, files/ and inventory/.

pyinfra reads group_data/ (and the deploys read files/) from the current directory, whatever
the inventory file's path: run from another directory, it would find no group data, and the
checks would name keys as missing that are written in group_data/. So a run that does not start
where its project is is refused, with one line that says to run from the repository root.
servefleet's own commands find the project from the inventory file's location and run there
(servefleet/cli/workdir.py); a `pyinfra` run must be started there.
"""

from __future__ import annotations

from pathlib import Path

from servefleet.core.errors import DataError

MARKER = Path("group_data") / "all.py"
WHY = "pyinfra reads group_data/ and files/ from the current directory"


def root_of(inventory_file: str | Path) -> Path | None:
    """The project an inventory file belongs to: the directory above its inventory/ folder,
    when that directory holds group_data/all.py; None for an inventory kept anywhere else."""
    path = Path(inventory_file).resolve()
    root = path.parent.parent
    return root if path.parent.name == "inventory" and (root / MARKER).is_file() else None


def check_cwd(inventory_file: str | Path, cwd: str | Path = ".") -> None:
    """Refuse (DataError, exit 2) a run whose current directory is not its inventory's project,
    or holds no group_data/all.py at all."""
    here = Path(cwd).resolve()
    root = root_of(inventory_file)
    if root is not None and root != here:
        raise DataError(
            f"inventory file {inventory_file} is in the project {root}, but this runs in "
            f"{here} ({WHY}): run from the repository root (cd {root})"
        )
    check_group_data(here)


def check_group_data(cwd: str | Path = ".") -> None:
    """Refuse a run in a directory without group_data/all.py: every host's data would miss the
    defaults, and each check would name a key as missing that is written there."""
    here = Path(cwd).resolve()
    if not (here / MARKER).is_file():
        raise DataError(f"no {MARKER} in {here} ({WHY}): run from the repository root")
