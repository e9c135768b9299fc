"""The metrics textfile refreshed by the verbs that check a node: drift (in sync or not), the
health gate (passed or not) and the performance gate (its figures, on the release records).
Each records its check in state/checks.json and renders the textfile from the node's records
(servefleet.core.metrics), both written by one command (servefleet.operations.metrics).

A textfile that cannot be written never fails the verb: refresh() answers why, in one line.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import replace

from servefleet.core import metrics, records
from servefleet.core.layout import NodeLayout
from servefleet.core.releases import Releases
from servefleet.facts import batch
from servefleet.facts.node import PathStat
from servefleet.facts.releases import NodeChecks, NodeReleases
from servefleet.operations import metrics as metrics_ops
from servefleet.operations.node import run


def _read(host, path: str, what: str) -> str:
    """A record's text as it is now (not a fact: the verbs change it within one session)."""
    ok, out, _ = run(host, records.read_command(path))
    if not ok:
        raise records.RecordError(f"{path} could not be read")
    return records.from_node(out.splitlines(), what)


def _now_read(host, lay: NodeLayout) -> tuple[Releases, metrics.Checks, dict | None]:
    """The records and the directory as they are now."""
    try:
        releases = Releases.loads(_read(host, lay.releases_file, "the release records"))
    except records.RecordError as exc:
        releases = Releases(unreadable=str(exc))
    try:
        checks = metrics.Checks.loads(_read(host, lay.checks_file, "checks.json"))
    except records.RecordError:
        checks = metrics.Checks()  # only the textfile reads it: rewritten below
    directory = posixpath.dirname(lay.metrics_textfile or "/")
    return releases, checks, host.get_fact(PathStat, path=directory)


def refresh(
    host, health: bool | None = None, drift: bool | None = None, read: bool = True
) -> str | None:
    """Record this check (health passed, drift in sync; None: not checked now) and write the
    textfile again. read=False: the records as this session's check read them (the drift
    check's facts: nothing changed since). None when done or when the host has no
    metrics_textfile_dir; else why not."""
    lay = NodeLayout.of(host.data)
    path = lay.metrics_textfile
    if path is None:
        return None
    directory = posixpath.dirname(path)
    try:
        if read:
            releases, checks, found = _now_read(host, lay)
        else:
            releases = batch.get(host, NodeReleases, path=lay.releases_file)
            checks = batch.get(host, NodeChecks, path=lay.checks_file)
            found = batch.get(host, PathStat, path=directory)
        problem = metrics_ops.dir_problem(host.name, directory, found)
        if problem:
            return problem
        now = int(time.time())
        if health is not None:
            checks = replace(checks, health_ok=health, health_at=now)
        if drift is not None:
            checks = replace(checks, drift_in_sync=drift, drift_at=now)
        text = metrics.render(releases, checks)
        files = [(lay.checks_file, checks.dumps()), (path, text)]
        ok, _, err = run(host, metrics_ops.write_command(directory, files))
        if not ok:
            return f"{host.name}: {path} could not be written: {err.strip()[-200:]}"
    except Exception as exc:  # a lost connection: the verb's own report says so
        return f"{host.name}: the metrics textfile was not written: {type(exc).__name__}: {exc}"
    return None
