"""pyinfra's API, the way servefleet's fleet-wide commands use it (drift, bench, status, rebuild).

One session = the operator's inventory file (group_data applied exactly as the CLI applies it),
a state in check mode, connections opened side by side. Hosts that cannot be reached are named.
"""

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch

from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state


@dataclass
class Session:
    state: State
    config: Config
    targets: list  # pyinfra Hosts selected by --limit (all when no limit)
    unreachable: dict = field(default_factory=dict)  # name -> why

    def reachable(self) -> list:
        return [h for h in self.targets if h.name not in self.unreachable]

    def each(self, func) -> dict:
        """Run func(host) for every reachable host side by side, in the host's context.

        Returns {name: result or the exception it raised}: one host's failure stops no other.
        """
        import gevent

        results = {}

        def call(host):
            try:
                with ctx_config.use(self.config.copy()), ctx_host.use(host):
                    results[host.name] = func(host)
            except Exception as exc:  # reported per host by the caller
                results[host.name] = exc

        gevent.joinall([self.state.pool.spawn(call, h) for h in self.reachable()])
        return results


def select(inventory, limit: list[str] | None) -> list:
    """Hosts matching any --limit pattern: a name, a glob or a group name."""
    if not limit:
        return list(inventory)
    return [h for h in inventory if any(fnmatch(h.name, p) or p in h.groups for p in limit)]


@contextmanager
def session(inventory_path: str, limit: list[str] | None = None, data: dict | None = None,
            check_for_changes: bool = True):
    # pyinfra_cli patches sockets for gevent on import, which parallel connections rely on.
    from pyinfra_cli.inventory import make_inventory

    state = State(check_for_changes=check_for_changes)
    state.cwd = os.getcwd()
    config = Config()
    ctx_state.set(state)
    ctx_config.set(config)
    inventory = make_inventory(inventory_path, cwd=state.cwd, override_data=data or {})
    ctx_inventory.set(inventory)
    targets = select(inventory, limit)
    state.init(inventory, config, initial_limit=targets)
    sess = Session(state, config, targets)
    try:
        state.set_stage(StateStage.Connect)
        try:
            connect_all(state)
        except PyinfraError:  # "No hosts remaining!": every target failed to connect
            pass
        for host in targets:
            if host in state.failed_hosts or host not in state.activated_hosts:
                sess.unreachable[host.name] = "could not connect"
        state.set_stage(StateStage.Prepare)
        yield sess
    finally:
        disconnect_all(state)


def run(host, command: str) -> tuple[bool, str, str]:
    """Run a shell command on host (inside Session.each); returns (ok, stdout, stderr)."""
    ok, output = host.run_shell_command(command)
    return ok, output.stdout, output.stderr
