"""Removing a big directory tree (a guest's disk, an image's root) with a bounded number of open
file descriptors, whatever the calling process has patched.

Why not shutil.rmtree: the testbed runs in processes that import pyinfra_cli, which runs
gevent's monkey.patch_all(). Since gevent 25.8.1 that patches os.close too, and once gevent's hub
exists, os.close of anything but a regular file (a directory included) only schedules the close
for the hub's next loop turn. shutil.rmtree opens every directory of the tree with os.open and
closes it with os.close, never yielding to the hub: every directory stays open until the
removal is over and the process next waits on gevent. A converged guest has thousands of
directories; `testbed down` of 50 of them ran out of descriptors (errno 24) half-way, after the
guests, before the hub and the network. `rm` in a process of its own keeps one descriptor per
level of the tree, and is faster too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def remove_tree(path: Path | str, *, check: bool = False) -> None:
    """Remove path and everything under it, staying on its filesystem (never through a mount
    still under it, such as a guest's overlay root that did not unmount). An absent path is no
    error; other failures raise only with check=True (shutil.rmtree(ignore_errors=not check))."""
    done = subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", str(path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if check and (done.returncode != 0 or Path(path).exists()):
        raise OSError(f"could not remove {path}: {done.stderr.strip()}")
