"""The testbed is root's: its guests are systemd-nspawn containers in a network namespace of its
own, and its state, SSH key and disks live in root's cache. Run as another user, a command would
find no state (an empty table, exit 0) or fail half-way with an error that advises the wrong fix,
so every testbed command, and the demo that brings the testbed up, is refused first."""

from __future__ import annotations

import os

EXIT_NEEDS_ROOT = 2  # refused before anything was touched (servefleet's exit codes)


def needs_root(command: str) -> str | None:
    """The one-line refusal of `command` when this process is not root, else None."""
    if os.geteuid() == 0:
        return None
    return (
        f"{command}: needs root (systemd-nspawn guests, network namespaces; the testbed's "
        f"state is root's); run it as root: sudo {command}"
    )
