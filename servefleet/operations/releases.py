"""Operations on a node's releases (servefleet.core.releases): record the current one after a
successful converge and prune what no kept release names; go back to the previous one."""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import host
from pyinfra.api import StringCommand, operation

from servefleet.core import releases as rel, sandbox
from servefleet.core.records import Unreadable
from servefleet.facts import batch
from servefleet.facts.releases import NodeReleases, RunningRelease
from servefleet.operations.files import upload
from servefleet.operations.node import fail_host


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@operation()
def record(releases_file: str, release, keep: int, bounds: list[str]):
    """
    Record what serves as the node's current release; prune directories only dropped releases
    named.

    + releases_file: the node's releases.json
    + release: () -> Release, built from facts when the operation runs (at execution: after
      this run's install, download and unit)
    + keep: releases kept, current included (releases_keep)
    + bounds: the only directories pruning may delete inside (venvs, builds, models)

    **Example:** servefleet.recipes.releases.record fills every argument.
    """
    current = batch.get(host, NodeReleases, path=releases_file)
    if current.unreadable:
        yield fail_host(
            f"{host.name}: {current.unreadable}; it was left as it is, nothing "
            "recorded (move it aside to start the records afresh)"
        )
        return
    new = release()
    if current.current and current.current.id == new.id and not current.rolled_back_from:
        host.noop(f"release {new.describe} is recorded")
        return
    updated, dropped = rel.record(current, rel.with_time(new, _now()), keep)
    if current.rolled_back_from and current.current and current.current.id == new.id:
        updated = rel.Releases(current.current, current.previous, None)  # converged back to it
        dropped = [current.rolled_back_from]
    yield from upload._inner(dest=releases_file, content=updated.dumps(), mode="644")
    for path in rel.prune_candidates(updated, dropped):
        if rel.bounded(path, bounds):
            yield StringCommand("rm", "-rf", "--one-file-system", shlex.quote(path))


@operation()
def rollback(
    releases_file: str,
    running_file: str,
    unit_dir: str,
    links: dict[str, str],
    force_previous: bool = False,
):
    """
    Serve the last healthy release again: its unit, its prefix (for an engine that serves
    through a link, the link moved back), a restart. Nothing is downloaded or built: a kept release's directories are on disk.

    Which one: the recorded current release is installed (recorded before its restart); when
    the service was found healthy with it (running.json), it is the release to go back *from*,
    so the previous one is served again. When it was not (its start or health check failed,
    or an attempt failed before installing anything), the current release is restored, and
    the previous one served if the current never ran healthy either.

    + releases_file: the node's releases.json
    + running_file: the node's running.json (the release the service now runs)
    + unit_dir: systemd's unit directory
    + links: {release engine: the link its prefix is served through} (Engine.current_link)
    + force_previous: go back to the previous release even from a healthy current one (an
      operator's `servefleet rollback`)

    Before anything changes, the release's own unit sandbox is probed (its recorded probe,
    servefleet.core.sandbox), as every converge does before a restart: a unit the node can no
    longer run fails this host and the running service is left as it is.

    Fails this host when there is no previous release. The health gate is the caller's.

    **Example:**

    .. code:: python

        releases.rollback(releases_file="/opt/servefleet/state/releases.json",
                          running_file="/opt/servefleet/state/running.json",
                          unit_dir="/etc/systemd/system",
                          links={"llama.cpp": "/opt/servefleet/llama.cpp/current"})
    """
    records = batch.get(host, NodeReleases, path=releases_file)
    running = batch.get(host, RunningRelease, path=running_file)
    unreadable = records.unreadable or (running if isinstance(running, Unreadable) else None)
    if unreadable:
        yield fail_host(f"{host.name}: {unreadable}; nothing was rolled back")
        return
    current = records.current
    back: rel.Releases | None
    if current is not None and running == current.id and not force_previous:
        back = records  # an attempt that failed before installing: current is still healthy
    else:
        back = rel.rollback(records)
    target = back.current if back is not None else None  # set whenever back is
    if back is None or target is None:
        yield fail_host(
            f"{host.name} {rel.NO_PREVIOUS}"
            + (f" (current: {current.describe})" if current else "")
        )
        return
    try:
        probe = _probe(target)
    except sandbox.UnitReadError as exc:
        yield fail_host(
            f"{host.name}: cannot probe {target.describe} before restarting into "
            f"it: {exc}; nothing was changed"
        )
        return
    yield StringCommand("sh", "-c", shlex.quote(probe))
    yield from upload._inner(dest=f"{unit_dir}/{target.unit}", content=target.unit_text, mode="644")
    link = links.get(target.engine)
    if link:
        q = shlex.quote
        yield StringCommand(
            f"ln -sfn {q(target.prefix)} {q(link + '.new')} && mv -T {q(link + '.new')} {q(link)}"
        )
    unit = shlex.quote(target.unit)
    yield StringCommand(f"systemctl daemon-reload && systemctl restart {unit}")
    yield from upload._inner(dest=releases_file, content=back.dumps(), mode="644")
    yield from upload._inner(
        dest=running_file, content=json.dumps({"release": target.id}) + "\n", mode="644"
    )


def _probe(target: rel.Release) -> str:
    """The probe script of the release's unit: its recorded probe command (or, for a release
    recorded before releases carried one, its program's --version) under its own sandbox."""
    user, props, environment, gpu = sandbox.unit_sandbox(target.unit_text)
    argv = target.probe_argv
    if not (isinstance(argv, (list, tuple)) and all(isinstance(a, str) for a in argv)):
        raise sandbox.UnitReadError("its recorded probe is not a list of words")
    return sandbox.probe_script(
        target.unit,
        user,
        props,
        environment,
        list(argv) or sandbox.version_argv(target.unit_text),
        gpu,
    )


@operation()
def mark_running(running_file: str, release):
    """
    Record which release the service runs, once it was (re)started and found healthy: a later
    converge restarts a service whose running release is not the one it installs, even when
    the run that changed it was interrupted before its restart.

    + running_file: the node's running.json
    + release: () -> Release (as for ``record``)

    **Example:** servefleet.engines.vllm.steps.health.
    """
    new = release()
    if batch.get(host, RunningRelease, path=running_file) == new.id:
        host.noop(f"{new.short} ({new.id}) is the running release")
        return
    yield from upload._inner(
        dest=running_file, content=json.dumps({"release": new.id}) + "\n", mode="644"
    )
