"""pyinfra's API, the way servefleet's fleet verbs use it (drift, status, bench, rebuild,
rollout, rollback): the one path by which they reach hosts and converge deploys.

A session = the operator's inventory file (validated at load, group_data applied exactly as the
CLI applies it), a state, connections opened side by side. Hosts that cannot be reached are
named, with pyinfra's reason; what pyinfra logs about each host is kept for the verb's report.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch

import gevent
import pyinfra
# pyinfra_cli patches sockets for gevent on import, which parallel connections rely on.
from pyinfra_cli.inventory import make_inventory
from pyinfra_cli.util import load_deploy_file
from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

from servefleet.core.inventory import reset_run_context, set_run_context

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"^\[([^\]]+)\]\s*(.*)$")


class HostLog(logging.Handler):
    """pyinfra's warnings and errors, by host: why a connection, a fact or a command failed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: dict[str, list[str]] = defaultdict(list)

    def emit(self, record):
        text = _ANSI.sub("", record.getMessage()).strip()
        match = _PREFIX.match(text)
        if match:
            self.lines[match.group(1).strip()].append(match.group(2))


@dataclass
class Session:
    state: State
    config: Config
    targets: list  # pyinfra Hosts selected by --limit (all when no limit)
    log: HostLog
    unreachable: dict = field(default_factory=dict)  # name -> why

    def reachable(self) -> list:
        return [h for h in self.targets if h.name not in self.unreachable]

    def each(self, func, hosts: list | None = None) -> dict:
        """Run func(host) for every reachable host (or those of `hosts`) side by side, in the
        host's context.

        Returns {name: result or the exception it raised}: one host's failure stops no other.
        """
        results = {}

        def call(host):
            try:
                with ctx_config.use(self.config.copy()), ctx_host.use(host):
                    results[host.name] = func(host)
            except Exception as exc:  # reported per host by the caller
                results[host.name] = exc

        chosen = [h for h in self.reachable() if hosts is None or h in hosts]
        gevent.joinall([self.state.pool.spawn(call, h) for h in chosen])
        return results

    def why(self, name: str, default: str = "") -> str:
        """What pyinfra said went wrong on a host: servefleet's own one-line reason when there is
        one (a failed check names it), else pyinfra's last error line."""
        lines = [line.strip() for line in self.log.lines.get(name, []) if line.strip()]
        ours = [line for line in lines if line.startswith("servefleet:")
                and not line.startswith("servefleet: the journal")]
        if ours:
            return ours[-1].removeprefix("servefleet:").strip()
        return lines[-1] if lines else default


def select(inventory, limit: list[str] | None) -> list:
    """Hosts matching any --limit pattern: a name, a glob or a group name."""
    if not limit:
        return list(inventory)
    return [h for h in inventory if any(fnmatch(h.name, p) or p in h.groups for p in limit)]


@contextmanager
def session(inventory_path: str, limit: list[str] | None = None, data: dict | None = None,
            deploy: str | None = None, check_for_changes: bool = True, debug: bool = False):
    """Connect to the inventory's hosts (--limit) for a verb. The inventory validates every
    host's data, --data included, for `deploy` before anything connects (DataError).
    `debug`: pyinfra's debug log on stderr too, as `pyinfra --debug` prints it (every command
    it runs on a host: "Running command on HOST: ...")."""
    state = State(check_for_changes=check_for_changes)
    state.cwd = os.getcwd()
    config = Config()
    log = HostLog()
    # pyinfra's log goes to the verb's report, not the terminal: our handler only, from WARNING.
    pyinfra_logger = logging.getLogger("pyinfra")
    saved = (pyinfra_logger.level, pyinfra_logger.propagate, pyinfra_logger.handlers)
    pyinfra_logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    pyinfra_logger.propagate, pyinfra_logger.handlers = False, [log]
    if debug:
        stderr = logging.StreamHandler(sys.stderr)
        stderr.setFormatter(logging.Formatter("    [%(name)s] %(message)s"))
        pyinfra_logger.handlers.append(stderr)
    was_cli, pyinfra.is_cli = pyinfra.is_cli, True  # operation order by call site, as the CLI
    token = set_run_context(data, deploy)
    ctx_state.set(state)
    ctx_config.set(config)
    try:
        inventory = make_inventory(inventory_path, cwd=state.cwd, override_data=data or {})
        ctx_inventory.set(inventory)
        targets = select(inventory, limit)
        state.init(inventory, config, initial_limit=targets)
        sess = Session(state, config, targets, log)
        state.set_stage(StateStage.Connect)
        try:
            connect_all(state)
        except PyinfraError:  # "No hosts remaining!": every target failed to connect
            pass
        for host in targets:
            if host in state.failed_hosts or host not in state.activated_hosts:
                sess.unreachable[host.name] = sess.why(host.name, "could not connect")
        state.set_stage(StateStage.Prepare)
        try:
            yield sess
        finally:
            disconnect_all(state)
    finally:
        reset_run_context(token)
        pyinfra.is_cli = was_cli
        pyinfra_logger.level, pyinfra_logger.propagate, pyinfra_logger.handlers = saved


@dataclass
class HostOutcome:
    name: str
    ok: bool
    changed: int = 0  # operations that ran commands
    operations: int = 0
    error: str | None = None


def load_deploy(sess: Session, deploy: str) -> None:
    """Load a deploy file for every reachable host (pyinfra's prepare stage)."""
    load_deploy_file(sess.state, deploy)


def execute(sess: Session) -> dict[str, HostOutcome]:
    """Run what the deploy planned, on every reachable host; one outcome per target."""
    state = sess.state
    state.set_stage(StateStage.Execute)
    try:
        run_ops(state)
    except PyinfraError:  # "No hosts remaining!": every host failed; each is reported below
        pass
    outcomes = {}
    for host in sess.targets:
        if host.name in sess.unreachable:
            outcomes[host.name] = HostOutcome(host.name, False, error=sess.unreachable[host.name])
            continue
        ops = state.ops.get(host, {})
        changed = sum(1 for d in ops.values()
                      if d.operation_meta.is_complete() and d.operation_meta.did_change())
        failed = host in state.failed_hosts
        outcomes[host.name] = HostOutcome(host.name, not failed, changed, len(ops),
                                          sess.why(host.name, "failed") if failed else None)
    return outcomes


def converge(inventory: str, deploy: str, limit: list[str] | None = None,
             data: dict | None = None) -> dict[str, HostOutcome]:
    """Converge `deploy` on the selected hosts through the API: rebuild's and rollout's path."""
    with session(inventory, limit, data, deploy=deploy) as sess:
        if sess.reachable():
            load_deploy(sess, deploy)
            return execute(sess)
        return {n: HostOutcome(n, False, error=why) for n, why in sess.unreachable.items()}
