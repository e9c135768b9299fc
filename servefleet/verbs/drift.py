"""Drift check: run a deploy in pyinfra's check mode (nothing changes) and classify every step.

`pyinfra --dry` exits 0 with changes pending, so it cannot gate anything. This runs the same
deploy through pyinfra's API with change detection on and sorts each operation, per host, into:

- in_sync      the operation would do nothing
- drifted      it would change the host
- conditional  it runs only if another operation changed (`_if=`: restarts, health checks)
- always_runs  it is not idempotent (pyinfra marks it so); shown apart, never counted as drift

Deep checks (see `deep_check`) add what operations alone do not see, e.g. installed versions vs
pins or a unit file's diff, as expected-vs-found pairs read with facts.
"""

import importlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from pyinfra_cli.util import exec_file

from servefleet.core.drift_items import ALWAYS, CONDITIONAL, DRIFTED, IN_SYNC, Item
from servefleet.core.errors import Exit
from servefleet.fleet import registry
from servefleet.fleet.data import recipe_of
from servefleet.verbs import metrics, session as api
from servefleet.verbs.deep_drift import deep_items

UNCHECKED = "unchecked"


@dataclass
class HostReport:
    name: str
    status: str = IN_SYNC  # in_sync | drifted | unchecked
    error: str | None = None
    items: list[Item] = field(default_factory=list)
    unreachable: bool = False  # unchecked because not connected (else a fact failed)


@dataclass
class Report:
    inventory: str
    deploy: str
    hosts: dict[str, HostReport] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        statuses = {h.status for h in self.hosts.values()}
        if UNCHECKED in statuses or not self.hosts:
            return Exit.UNREACHABLE
        return Exit.DIFFERS if DRIFTED in statuses else Exit.OK

    def to_dict(self) -> dict:
        counts = {
            s: sum(h.status == s for h in self.hosts.values())
            for s in (IN_SYNC, DRIFTED, UNCHECKED)
        }
        return {
            "inventory": self.inventory,
            "deploy": self.deploy,
            "hosts": {n: asdict(h) for n, h in self.hosts.items()},
            "summary": {"hosts": len(self.hosts), **counts},
            "exit_code": int(self.exit_code),
        }


# --- which operation functions are not idempotent: pyinfra keeps that on the function only ----
# (`pyinfra.api.operation` the module is shadowed by the `operation` decorator of pyinfra.api:
# `import ... as` binds the decorator at runtime; mypy resolves the module, as import_module does.)
if TYPE_CHECKING:
    import pyinfra.api.operation as pyinfra_operation
else:
    pyinfra_operation = importlib.import_module("pyinfra.api.operation")
_non_idempotent_names: set[str] = set()
_original_generate_name = pyinfra_operation.generate_operation_name


def _recording_generate_name(func, host, kwargs, global_arguments):
    names, add_args = _original_generate_name(func, host, kwargs, global_arguments)
    if not getattr(func, "is_idempotent", True):
        _non_idempotent_names.update(names)
    return names, add_args


def _command_text(op_data) -> str:
    """The first command the operation would run (masked, shortened), for 'found'."""
    try:
        for command in op_data.command_generator():
            kind = type(command).__name__
            if kind in ("FileUploadCommand", "FunctionCommand"):  # say where, never the content
                target = getattr(command, "dest", None) or (
                    command.args[0] if getattr(command, "args", None) else ""
                )
                text = f"upload {target}"
            elif hasattr(command, "get_masked_value"):
                text = command.get_masked_value()
            else:
                text = str(command)
            return text if len(text) <= 160 else text[:157] + "..."
    except Exception as exc:  # a failing fact while re-generating: report, don't crash
        return f"(could not render: {exc})"
    return ""


def _classify(state, host) -> list[Item]:
    items = []
    for op_hash in state.get_op_order():
        if op_hash not in state.ops[host]:
            continue
        op_data = state.get_op_data_for_host(host, op_hash)
        meta = state.op_meta[op_hash]
        name = " / ".join(sorted(meta.names))
        if op_data.global_arguments.get("_if"):  # e.g. a restart when a dependency changed
            items.append(Item("operation", name, CONDITIONAL))
        elif meta.names & _non_idempotent_names:
            items.append(Item("operation", name, ALWAYS))
        elif op_data.operation_meta._maybe_is_change:
            items.append(Item("operation", name, DRIFTED, "no change", _command_text(op_data)))
        else:
            items.append(Item("operation", name, IN_SYNC))
    return items


def check(
    inventory_path: str,
    deploy_path: str,
    limit: list[str] | None = None,
    data: dict | None = None,
    debug: bool = False,
) -> Report:
    """Load `deploy_path` for every host of the inventory in check mode and classify it."""
    report = Report(inventory_path, deploy_path)
    pyinfra_operation.generate_operation_name = _recording_generate_name
    try:
        with api.session(inventory_path, limit, data, deploy=deploy_path, debug=debug) as sess:
            for host in sess.targets:
                report.hosts[host.name] = HostReport(host.name)
            for name, why in sess.unreachable.items():
                report.hosts[name].status, report.hosts[name].error = UNCHECKED, why
                report.hosts[name].unreachable = True

            def load(host):
                exec_file(deploy_path)
                deep = deep_items(host, recipe_of(deploy_path))
                if host in sess.state.failed_hosts:  # a fact could not be read
                    raise RuntimeError(sess.why(host.name, "a fact could not be read"))
                return _classify(sess.state, host) + deep

            for name, result in sess.each(load).items():
                rep = report.hosts[name]
                if isinstance(result, Exception):  # a failed fact: not checked
                    if getattr(result, "exit_code", None) == Exit.BAD_INPUT:
                        raise result  # bad data stops the whole check, as a converge
                    rep.status, rep.error = UNCHECKED, f"{type(result).__name__}: {result}"
                    continue
                rep.items = result
                if any(i.state == DRIFTED for i in rep.items):
                    rep.status = DRIFTED
            recipe = recipe_of(deploy_path)
            if recipe in registry.serving_deploys():  # the node's whole serving state: recorded

                def note(host):
                    rep = report.hosts[host.name]
                    if rep.status != UNCHECKED and registry.applies(recipe, host.groups):
                        metrics.refresh(host, drift=rep.status == IN_SYNC, read=False)

                sess.each(note)
    finally:
        pyinfra_operation.generate_operation_name = _original_generate_name
    return report
