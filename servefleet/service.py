"""A systemd service that restarts only when something it depends on changed.

Shared by the recipes: render the unit from files/, reload systemd when the unit changed, keep
the service in the state data asks for, and restart it only when one of the operations it
depends on (unit, binary, venv, patch, model) changed in this run. `started()` tells later
steps (health checks, smoke tests) whether the service was (re)started in this run, for `_if=`.
"""

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, systemd


@dataclass
class ServiceRun:
    unit: object  # OperationMeta of the unit upload
    ensure: object  # OperationMeta of "running/stopped + enabled"
    restart: object  # OperationMeta of the conditional restart

    def started(self) -> bool:
        """True when this run started or restarted the service (call at execution time)."""
        return self.ensure.did_change() or self.restart.did_change()


@deploy("Service")
def systemd_service(name: str, template: str, context: dict, depends_on: list = ()) -> ServiceRun:
    """
    Install `/etc/systemd/system/{name}` from a template and keep it as data says.

    + name: unit name, e.g. servefleet-llama.service
    + template: jinja2 template under files/
    + context: template variables
    + depends_on: OperationMetas whose change requires a restart
    """
    unit = files.template(name=f"Unit {name}", src=template, dest=f"/etc/systemd/system/{name}",
                          mode="644", **context)
    systemd.daemon_reload(name="Reload systemd (unit changed)", _if=unit.did_change)
    running = host.data.service_state == "running"
    ensure = systemd.service(name=f"{name} {host.data.service_state}", service=name,
                             running=running, enabled=host.data.service_enabled)
    deps = [unit, *depends_on]
    restart = systemd.service(
        name=f"Restart {name} (a dependency changed)", service=name, running=True,
        restarted=True,
        # Not when stopped by data, and not twice when `ensure` has just started it.
        _if=lambda: running and not ensure.did_change() and any(d.did_change() for d in deps),
    )
    return ServiceRun(unit=unit, ensure=ensure, restart=restart)
