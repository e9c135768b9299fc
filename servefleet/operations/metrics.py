"""servefleet's metrics on a node: the node_exporter textfile (servefleet.core.metrics), written
atomically as root (a temporary file beside it, then a rename: node_exporter never reads half a
file, and reads *.prom only), root-owned 0644, in a directory only root writes: neither the
engine's service user nor anyone else but root can change what Prometheus is told. One command
writes the checks record and the textfile (a drift check costs one command more than its read).

A converge writes it as its last step (`textfile`); the verbs that check a node (drift, the
health and performance gates) through servefleet.verbs.metrics.refresh.
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import replace

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.files import File, Sha256File

from servefleet.core import metrics
from servefleet.facts import batch
from servefleet.facts.node import PathStat
from servefleet.facts.releases import NodeChecks, NodeReleases
from servefleet.operations.node import fail_host

KEY = "metrics_textfile_dir"


def dir_problem(name: str, directory: str, found: dict | None) -> str | None:
    """Why servefleet may not write its textfile into `directory` (PathStat of it; None when
    absent: root makes it, 0755); None when it may. One line: host, key, what was expected."""
    if found is None:
        return None
    mode = int(str(found.get("mode", "0")), 8)
    if found.get("type") == "directory" and found.get("user") == "root" and not mode & 0o022:
        return None
    return (
        f"{name}: {KEY} = {directory} is a {found.get('type')} owned by "
        f"{found.get('user')}:{found.get('group')} mode {str(found.get('mode')).zfill(4)}; "
        f"expected a directory root owns and only root writes (node_exporter reads it), so "
        f"that no other account can change servefleet's metrics"
    )


def in_place(target, path: str, text: str) -> bool:
    """Is the textfile there with exactly this text, root's and 0644?"""
    stat = batch.get(target, File, path=path)
    return bool(
        stat
        and stat.get("user") == "root"
        and str(stat.get("mode")) == "644"
        and batch.get(target, Sha256File, path=path) == hashlib.sha256(text.encode()).hexdigest()
    )


def write_command(directory: str, files: list[tuple[str, str]]) -> StringCommand:
    """One command that writes each (path, text) atomically as root: the directory made when
    missing (root 0755), each file's bytes (base64: no byte of a label reaches the shell) into
    `<path>.servefleet-new` under umask 077, root:root 0644, renamed into place. Only root
    writes these directories (dir_problem, state/), so the temporary name is no one else's."""
    q = shlex.quote
    steps = [f"(umask 022 && mkdir -p -- {q(directory)})", "umask 077"]
    for path, text in files:
        part = q(f"{path}.servefleet-new")
        encoded = base64.b64encode(text.encode()).decode()
        steps.append(
            f"printf %s {encoded} | base64 -d > {part} && chown root:root {part} && "
            f"chmod 644 {part} && mv -fT {part} {q(path)}"
        )
    return StringCommand("sh", "-c", q(" && ".join(steps)))


@operation()
def textfile(path: str, releases_file: str, checks_file: str, health_ran: Callable[[], bool]):
    """
    servefleet's node_exporter textfile, rendered from the node's records: its releases (as
    recorded by this run) and its last health and drift checks; a health check that this run
    ran (after a restart) is recorded first.

    + path: the textfile ({metrics_textfile_dir}/servefleet.prom)
    + releases_file: the node's releases.json
    + checks_file: the node's checks.json
    + health_ran: () -> True when this run's health check ran (and passed: a failed one fails
      the host before this step); called at execution only

    Fails this host when the directory is not root's alone (dir_problem).

    **Example:** servefleet.recipes.serving.health.
    """
    directory = posixpath.dirname(path)
    problem = dir_problem(host.name, directory, batch.get(host, PathStat, path=directory))
    if problem:
        yield fail_host(problem)
        return
    checks = batch.get(host, NodeChecks, path=checks_file)
    files = []
    if host.state.is_executing and health_ran():
        checks = replace(checks, health_ok=True, health_at=int(time.time()))
        files.append((checks_file, checks.dumps()))
    text = metrics.render(batch.get(host, NodeReleases, path=releases_file), checks)
    if not files and in_place(host, path, text):
        host.noop(f"{path} is up to date")
        return
    yield write_command(directory, [*files, (path, text)])
