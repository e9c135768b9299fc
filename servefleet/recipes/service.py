"""A systemd service that restarts only when what it runs changed.

Shared by both serving recipes: render the unit from files/, reload systemd when it changed,
keep the service in the state data asks for, and restart it when one of the operations it
depends on (unit, binary, venv, patch, model, key) changed in this run, or when the release it
runs (state/running.json, written once a start was found healthy) is not the one this run
installs: an earlier run interrupted between its changes and its restart is finished here.
`started()` tells the health step whether the service was (re)started in this run, for `_if=`.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import Sha256File
from pyinfra.operations import server, systemd

from servefleet.core.layout import NodeLayout
from servefleet.core.releases import Release
from servefleet.core.systemd import render_unit
from servefleet.facts import batch
from servefleet.facts.releases import RunningRelease
from servefleet.operations import files, node, sandbox
from servefleet.recipes import releases
from servefleet.recipes.steps import Changes, deploy


@dataclass
class ServiceRun:
    unit: OperationMeta  # the unit upload
    ensure: OperationMeta  # "running/stopped + enabled"
    restart: OperationMeta  # the conditional restart
    running: bool  # data wants it running (service_state)
    release_of: Callable[[], Release]  # the Release this run installs

    def started(self) -> bool:
        """True when this run started or restarted the service (call at execution time).

        `ensure` also changes when a stopped-by-data unit is only enabled: that is no start.
        """
        return self.running and (self.ensure.did_change() or self.restart.did_change())


@dataclass
class AnyChanged:
    """Several operations as one service dependency: changed when any of them did."""

    ops: list[OperationMeta]

    def did_change(self) -> bool:
        return any(op.did_change() for op in self.ops)


def _restart_or_show_journal(unit: str) -> str:
    # A failed (re)start names its cause: the unit's last journal lines go to pyinfra's output.
    q = shlex.quote(unit)
    return (
        f"systemctl restart {q} || {{ echo 'servefleet: {unit} failed to start; its journal:'"
        f" >&2; journalctl -u {q} -n 40 --no-pager >&2; exit 1; }}"
    )


@deploy("Service")
def systemd_service(
    unit: str,
    template: str,
    context: dict,
    release_of: Callable[[], Release],
    probe_argv: list[str],
    depends_on: Sequence[Changes] = (),
) -> ServiceRun:
    """
    Install `/etc/systemd/system/{unit}` from a template and keep it as data says.

    + unit: unit name, e.g. servefleet-llama.service (positional: `name=` is the deploy's title)
    + template: jinja2 template under files/
    + context: template variables; a callable value is called while rendering (at execution
      too), e.g. a lint read on the node after this run's download
    + release_of: () -> Release this run installs (servefleet.recipes.releases.build)
    + probe_argv: the sandbox probe's command (servefleet.core.sandbox), run under the unit's
      own sandbox before anything of the unit changes, whenever a (re)start will follow
    + depends_on: OperationMetas (or objects with did_change()) whose change requires a restart
    """
    running_file = NodeLayout.of(host.data).running_file
    unit_path = NodeLayout.unit_path(unit)
    running = host.data.service_state == "running"

    def stale() -> bool:  # read when the restart decides, at execution
        return batch.get(host, RunningRelease, path=running_file) != release_of().id

    def unit_differs() -> bool:  # the unit as this run renders it vs the node's, before upload
        rendered = hashlib.sha256(render_unit(template, context).encode()).hexdigest()
        return batch.get(host, Sha256File, path=unit_path) != rendered

    # A (re)start follows: try the sandbox first, so a setting that stops the engine fails this
    # host before the unit is replaced and the running service is left as it was.
    sandbox.probe(
        name=f"Sandbox probe of {unit} (before the restart)",
        unit=unit,
        user=context["service_user"],
        properties=context["sandbox"],
        environment=context["environment"],
        argv=probe_argv,
        gpu=bool(context["gpu_setup"]),
        _if=lambda: (
            running and (unit_differs() or stale() or any(d.did_change() for d in depends_on))
        ),
    )
    unit_op = files.upload(
        name=f"Unit {unit}",
        dest=unit_path,
        content=lambda: render_unit(template, context),
        mode="644",
    )
    # What is installed is recorded before the restart: a failed start leaves it recorded (and
    # not running.json), which is how a rollback knows to go back from it.
    releases.record(release_of)
    systemd.daemon_reload(name="Reload systemd (unit changed)", _if=unit_op.did_change)
    ensure = node.service(
        name=f"{unit} {host.data.service_state}",
        unit=unit,
        running=running,
        enabled=host.data.service_enabled,
    )
    deps: list[Changes] = [unit_op, *depends_on]
    restart = server.shell(
        name=f"Restart {unit} (a dependency changed)",
        commands=[_restart_or_show_journal(unit)],
        # Not when stopped by data, and not twice when `ensure` has just started it.
        _if=lambda: (
            running and not ensure.did_change() and (any(d.did_change() for d in deps) or stale())
        ),
    )
    return ServiceRun(
        unit=unit_op, ensure=ensure, restart=restart, running=running, release_of=release_of
    )
