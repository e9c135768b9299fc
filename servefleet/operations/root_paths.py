"""What root installs from, runs or compiles with, checked on the node before it is used.

The data side (core.data.root_reads_problems) keeps these paths on an allow list of places;
this is the node side: who can change them there. recipes.base plans the reads with the base's
(one command per node) and runs the check in the preflight, before anything is installed,
built or run.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from servefleet.core.layout import NodeLayout
from servefleet.core.node import others_may_write, own_dir_problem, root_only_problem
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
    problems = [
        p
        for p in (
            root_only_problem(key, path, batch.get(host, PathChain, path=path))
            for key, path in paths.items()
        )
        if p
    ]
    if problems:
        yield fail_host(f"{host.name}: " + "; ".join(problems))
    else:
        host.noop("only root can change " + ", ".join(paths.values()))


@operation()
def own_dirs(dirs: tuple, owners: dict[str, str], earlier: dict[str, bool]):
    """
    Fail this host unless each directory servefleet makes its own may be: every directory above
    it root's and writable by root only, and it absent or servefleet's (root's marker in it;
    ``core.node.own_dir_problem``). Runs in the preflight and before rebuild deletes anything.

    + dirs: ``(data key, directory)`` pairs (``NodeLayout.own_dirs``)
    + owners: ``{data key: account}`` that owns the directory (root for the tree)
    + earlier: ``{data key: bool}``: an earlier servefleet's own, made before markers (adopted)

    **Example:**

    .. code:: python

        root_paths.own_dirs(dirs=(("servefleet_root", "/opt/servefleet"),),
                            owners={"servefleet_root": "root"}, earlier={})
    """
    problems = []
    for key, path in dirs:
        marker = NodeLayout.own_marker(path)
        chains = batch.get(host, PathChain, path=marker)
        own = next((e for e in (chains or {}).get("W", []) if e["path"] == path), None)
        legacy = (
            bool(earlier.get(key))
            and own is not None
            and own["user"] == owners.get(key)
            and not (owners.get(key) == "root" and others_may_write(own))
        )
        problem = own_dir_problem(key, path, marker, chains, legacy)
        if problem:
            problems.append(problem)
    if problems:
        yield fail_host(f"{host.name}: " + "; ".join(problems))
    else:
        host.noop("servefleet's own directories: " + ", ".join(p for _, p in dirs))
