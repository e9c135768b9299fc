"""pyinfra's API, the way servefleet's fleet verbs use it (drift, status, bench, rebuild,
rollout, rollback): the one path by which they reach hosts and converge deploys.

A session = the operator's inventory file (validated at load, group_data applied exactly as the
CLI applies it), a state, connections opened side by side. Hosts that cannot be reached are
named, with pyinfra's reason; what pyinfra logs about each host is kept for the verb's report.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

import gevent
import pyinfra
from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

# pyinfra_cli patches sockets for gevent on import, which parallel connections rely on.
from pyinfra_cli.exceptions import UnexpectedExternalError
from pyinfra_cli.inventory import make_inventory
from pyinfra_cli.util import load_deploy_file

from servefleet.core.errors import DataError
from servefleet.core.node_output import shown
from servefleet.fleet.data import settle
from servefleet.fleet.inventory import fleet_path, reset_run_context, set_run_context
from servefleet.verbs.progress import OperationProgress

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
        ours = [
            line
            for line in lines
            if line.startswith("servefleet:") and not line.startswith("servefleet: the journal")
        ]
        # pyinfra's lines quote what nodes print: escaped before any reaches the terminal
        if ours:
            return shown(ours[-1].removeprefix("servefleet:").strip())
        return shown(lines[-1]) if lines else default


def select(inventory, limit: list[str] | None) -> list:
    """Hosts matching any --limit pattern: a name, a glob or a group name."""
    if not limit:
        return list(inventory)
    return [h for h in inventory if any(fnmatch(h.name, p) or p in h.groups for p in limit)]


def _names(names, most: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:most]) + (f", … ({len(names)} in all)" if len(names) > most else "")


def check_file(kind: str, path: str, folder: str) -> None:
    """Refuse (DataError, exit 2) an inventory or deploy path that names no file, before
    pyinfra reads it: pyinfra takes an unknown name for a host or a module and finds no host."""
    if Path(path).is_file():
        return
    cwd = Path.cwd()
    known = (
        sorted(str(p.relative_to(cwd)) for p in (cwd / folder).glob("*.py"))
        if (cwd / folder).is_dir()
        else []
    )
    close = difflib.get_close_matches(path, known, n=1)
    if close:
        hint = f"did you mean {close[0]}?"
    elif known:
        hint = f"expected one of {_names(known)}"
    else:
        hint = f"no {folder}/ here: run from the repository root"
    what = "is not a file" if Path(path).exists() else "not found"
    raise DataError(f"{kind} file {path}: {what} in {cwd}; {hint}")


def load_inventory(inventory_path: str, cwd: str, data: dict | None):
    """pyinfra's inventory from an inventory file; a file that is no inventory (fleet.yml, a
    deploy, a syntax error) is refused with one line (DataError), not a traceback."""
    if not inventory_path.endswith(".py"):
        raise DataError(
            f"inventory file {inventory_path}: expected a Python inventory such as "
            f"inventory/fleet.py (they read {fleet_path()})"
        )
    try:
        return make_inventory(inventory_path, cwd=cwd, override_data=data or {})
    except (UnexpectedExternalError, SyntaxError) as exc:
        error = getattr(exc, "exception", exc)
        why = (str(error).strip().splitlines() or [""])[0]
        raise DataError(
            f"inventory file {inventory_path}: could not be loaded "
            f"({type(error).__name__}{': ' + why if why else ''}); expected an "
            f"inventory such as inventory/fleet.py"
        ) from None


def check_selection(inventory_path: str, inventory, targets: list, limit) -> None:
    """Refuse an inventory with no host, or a --limit that selects none of its hosts."""
    hosts = list(inventory)
    if not hosts:
        raise DataError(
            f"inventory {inventory_path} has no hosts: {fleet_path()} lists no node "
            f"for it; add one entry per node (see docs/nodes.md)"
        )
    if limit and not targets:
        groups = sorted({g for h in hosts for g in h.groups})
        raise DataError(
            f"--limit {' '.join(limit)} matches no host of {inventory_path} "
            f"(hosts: {_names(h.name for h in hosts)}; groups: {_names(groups)})"
        )


@contextmanager
def session(
    inventory_path: str,
    limit: list[str] | None = None,
    data: dict | None = None,
    deploy: str | None = None,
    check_for_changes: bool = True,
    debug: bool = False,
):
    """Connect to the inventory's hosts (--limit) for a verb. The inventory validates every
    host's data, --data included, for `deploy` before anything connects (DataError).
    `debug`: pyinfra's debug log on stderr too, as `pyinfra --debug` prints it (every command
    it runs on a host: "Running command on HOST: ...").
    A missing inventory or deploy file, an inventory with no host and a --limit that selects
    none are refused (DataError) before anything connects."""
    check_file("inventory", inventory_path, "inventory")
    if deploy:
        check_file("deploy", deploy, "deploys")
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
        inventory = load_inventory(inventory_path, state.cwd, data)
        ctx_inventory.set(inventory)
        for host in inventory:  # validated at load: sizes written 8GiB are read as bytes
            settle(host.data)
        targets = select(inventory, limit)
        check_selection(inventory_path, inventory, targets, limit)
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


def cannot_reach(unreachable: dict[str, str]) -> str:
    """The one line of a verb that refuses because hosts are unreachable (exit 3)."""
    return (
        "cannot reach "
        + ", ".join(f"{n} ({why})" for n, why in unreachable.items())
        + "; nothing was changed"
    )


@dataclass
class HostOutcome:
    name: str
    ok: bool
    changed: int = 0  # operations that ran commands
    operations: int = 0
    error: str | None = None
    unreachable: bool = False  # not connected: error says why


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
            outcomes[host.name] = HostOutcome(
                host.name, False, error=sess.unreachable[host.name], unreachable=True
            )
            continue
        ops = state.ops.get(host, {})
        changed = sum(
            1
            for d in ops.values()
            if d.operation_meta.is_complete() and d.operation_meta.did_change()
        )
        failed = host in state.failed_hosts
        outcomes[host.name] = HostOutcome(
            host.name,
            not failed,
            changed,
            len(ops),
            sess.why(host.name, "failed") if failed else None,
        )
    return outcomes


def converge(
    inventory: str,
    deploy: str,
    limit: list[str] | None = None,
    data: dict | None = None,
    on_operation: Callable[[str], None] | None = None,
) -> dict[str, HostOutcome]:
    """Converge `deploy` on the selected hosts through the API: rebuild's and rollout's path.
    `on_operation` hears each operation as it starts ("operation 3 of 41: ..."), for a status
    line: a converge takes minutes."""
    with session(inventory, limit, data, deploy=deploy) as sess:
        if sess.reachable():
            load_deploy(sess, deploy)
            if on_operation is not None:
                sess.state.add_callback_handler(OperationProgress(on_operation))
            return execute(sess)
        return {
            n: HostOutcome(n, False, error=why, unreachable=True)
            for n, why in sess.unreachable.items()
        }
