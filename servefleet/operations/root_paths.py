"""What root installs from, runs or compiles with, checked on the node before it is used.

The data side (core.data.root_reads_problems) keeps these paths on an allow list of places;
this is the node side: who can change them there. recipes.base plans the reads with the base's
(one command per node) and runs the check in the preflight, before anything is installed,
built or run.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from servefleet.core.node import root_only_problem
from servefleet.facts import batch
from servefleet.facts.node import PathChain
from servefleet.operations.node import fail_host


@operation()
def root_only(paths: dict[str, str]):
    """
    Fail this host unless only root can change each path root installs from, runs or compiles
    with (uv's and ccache's caches, local wheel directories, interpreters: ``core.data.
    root_reads``): the path, every directory above it up to /, and the same for what it
    resolves to, are owned by root and neither group- nor other-writable (a sticky /tmp-like
    directory counts as writable). Anyone who can write one of them can replace what root
    then installs or runs.

    + paths: ``{data key: path}``

    A path that does not exist yet passes when the directories above it do: root makes it.
    The data side (where these may lie at all) is ``core.data.root_reads_problems``.

    **Example:**

    .. code:: python

        root_paths.root_only(paths={"uv_cache_dir": "/var/cache/servefleet/uv"})
    """
    problems = [p for p in (root_only_problem(key, path, batch.get(host, PathChain, path=path))
                            for key, path in paths.items()) if p]
    if problems:
        yield fail_host(f"{host.name}: " + "; ".join(problems))
    else:
        host.noop("only root can change " + ", ".join(paths.values()))
