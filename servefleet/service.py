"""A systemd service that restarts only when something it depends on changed.

Shared by the recipes: render the unit from files/, reload systemd when the unit changed, keep
the service in the state data asks for, and restart it only when one of the operations it
depends on (unit, binary, venv, patch, model) changed in this run. `started()` tells later
steps (health checks, smoke tests) whether the service was (re)started in this run, for `_if=`.
"""

import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

# files.template takes these as the uploaded file's owner and mode, not as template variables.
RESERVED_CONTEXT = {"user", "group", "mode", "src", "dest", "create_remote_dir"}


@dataclass
class ServiceRun:
    unit: object  # OperationMeta of the unit upload
    ensure: object  # OperationMeta of "running/stopped + enabled"
    restart: object  # OperationMeta of the conditional restart
    running: bool  # data wants it running (service_state)

    def started(self) -> bool:
        """True when this run started or restarted the service (call at execution time).

        `ensure` also changes when a stopped-by-data unit is only enabled: that is no start.
        """
        return self.running and (self.ensure.did_change() or self.restart.did_change())


def _restart_or_show_journal(unit: str) -> str:
    # A failed (re)start names its cause: the unit's last journal lines go to pyinfra's output.
    q = shlex.quote(unit)
    return (f"systemctl restart {q} || {{ echo 'servefleet: {unit} failed to start; its journal:'"
            f" >&2; journalctl -u {q} -n 40 --no-pager >&2; exit 1; }}")


@deploy("Service")
def systemd_service(unit: str, template: str, context: dict, depends_on: list = ()) -> ServiceRun:
    """
    Install `/etc/systemd/system/{unit}` from a template and keep it as data says.

    + unit: unit name, e.g. servefleet-llama.service (positional: `name=` is the deploy's title)
    + template: jinja2 template under files/
    + context: template variables (not user/group/mode: see RESERVED_CONTEXT)
    + depends_on: OperationMetas (or objects with did_change()) whose change requires a restart
    """
    clash = RESERVED_CONTEXT & set(context)
    if clash:
        raise ValueError(f"template variables {sorted(clash)} clash with files.template's own "
                         "arguments; rename them (e.g. service_user)")
    unit_op = files.template(name=f"Unit {unit}", src=template,
                             dest=f"/etc/systemd/system/{unit}", mode="644", **context)
    systemd.daemon_reload(name="Reload systemd (unit changed)", _if=unit_op.did_change)
    running = host.data.service_state == "running"
    ensure = systemd.service(name=f"{unit} {host.data.service_state}", service=unit,
                             running=running, enabled=host.data.service_enabled)
    deps = [unit_op, *depends_on]
    restart = server.shell(
        name=f"Restart {unit} (a dependency changed)", commands=[_restart_or_show_journal(unit)],
        # Not when stopped by data, and not twice when `ensure` has just started it.
        _if=lambda: running and not ensure.did_change() and any(d.did_change() for d in deps),
    )
    return ServiceRun(unit=unit_op, ensure=ensure, restart=restart, running=running)
