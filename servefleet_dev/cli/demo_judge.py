"""How the demo judges one host in one step, from that host's own result of the verb the step
ran (never from the verb's exit code, which sums up every host): (verdict, detail). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from servefleet.core.drift_items import DRIFTED
from servefleet.fleet.registry import parse_role, role_names
from servefleet.verbs.bench import NodeResult
from servefleet.verbs.drift import UNCHECKED, HostReport
from servefleet.verbs.session import HostOutcome
from servefleet.verbs.status import NodeStatus
from servefleet_dev.cli.demo_report import FAIL, PASS, UNREACHABLE

Judged = tuple[str, str]
# The roles that serve (a node class with an engine), from the registry.
SERVING_ROLES = tuple(r for r in role_names() if parse_role(r)[1] is not None)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def host_up(systemd: str | None, material_error: str | None = None) -> Judged:
    """Step 1: the guest booted to the end (systemd running or degraded) and the test material
    (wheels, models, the llama.cpp mirror) is ready on this machine."""
    if systemd is None:
        return FAIL, "not in the testbed's state"
    if systemd in ("stopped", "unreachable"):
        return UNREACHABLE, f"systemd {systemd}"
    if systemd not in ("running", "degraded"):
        return FAIL, f"systemd {systemd}"
    if material_error:
        return FAIL, f"test material not prepared: {material_error}"
    return PASS, ""


def converged(results: Sequence[tuple[str, HostOutcome]], again: bool = False) -> Judged:
    """Steps 2 and 3: every deploy converged on the host without an error; `again`: and
    changed nothing."""
    if not results:
        return FAIL, "no converge reached it"
    for _, o in results:
        if o.unreachable:
            return UNREACHABLE, o.error or "could not connect"
    for deploy, o in results:
        if not o.ok:
            return FAIL, f"{deploy}: {o.error or 'failed'}"
    changed = [(d, o) for d, o in results if o.changed]
    if again and changed:
        return FAIL, "; ".join(
            f"{d}: {o.changed} of {_plural(o.operations, 'operation')} changed, expected none"
            for d, o in changed
        )
    total = sum(o.changed for _, o in results)
    return PASS, "" if again else f"{_plural(total, 'operation')} changed"


def drifted_names(report: HostReport) -> str:
    return ", ".join(i.name.rsplit(" | ", 1)[-1] for i in report.items if i.state == DRIFTED)


def in_sync(results: Sequence[tuple[str, HostReport | None]]) -> Judged:
    """Step 4: the host is in sync with every recipe (a recipe of another role: a no-op)."""
    for _, rep in results:
        if rep is not None and rep.unreachable:
            return UNREACHABLE, rep.error or "could not connect"
    for deploy, rep in results:
        if rep is None:
            return FAIL, f"{deploy}: not checked"
        if rep.status == UNCHECKED:
            return FAIL, f"{deploy}: unchecked: {rep.error}"
        if rep.status == DRIFTED:
            return FAIL, f"{deploy}: drifted: {drifted_names(rep)}"
    return PASS, ""


def caught(report: HostReport | None, unit: str) -> str | None:
    """The drifted item that names the hand-edited unit, or None: not caught."""
    if report is None or report.status != DRIFTED:
        return None
    return next(
        (i.name for i in report.items if i.state == DRIFTED and unit in i.name),
        None,
    )


def repaired(
    report: HostReport | None,
    unit: str,
    outcome: HostOutcome | None,
    after: HostReport | None,
) -> Judged:
    """Step 5: the drift check caught the hand-edited unit on the host (whatever it found on
    the others), the repairing converge changed it back, and a check finds it in sync."""
    if report is not None and report.unreachable:
        return UNREACHABLE, f"drift check: {report.error}"
    item = caught(report, unit)
    if item is None:
        found = "not checked" if report is None else report.status
        if report is not None and report.error:
            found += f": {report.error}"
        return FAIL, f"drift not caught (the check found it {found})"
    if outcome is None or outcome.unreachable:
        return UNREACHABLE, f"caught; repairing converge: {outcome.error if outcome else 'not run'}"
    if not outcome.ok:
        return FAIL, f"caught; the repairing converge failed: {outcome.error}"
    if not outcome.changed:
        return FAIL, "caught; the repairing converge changed nothing"
    if after is None or after.unreachable:
        return UNREACHABLE, f"caught, repaired; check after: {after.error if after else 'not run'}"
    if after.status != "in_sync":
        return FAIL, f"caught, repaired, but the check after found it {after.status}"
    return PASS, f"caught, repaired ({_plural(outcome.changed, 'change')}), in sync again"


def benched(result: NodeResult) -> Judged:
    """Step 6: the node served the bench's requests, both figures measured."""
    if result.ok:
        return PASS, (
            f"{result.median_decode_tok_s or 0:.1f} tok/s, TTFT {result.median_ttft_s or 0:.3f} s"
        )
    return (UNREACHABLE if result.unreachable else FAIL), result.error or "failed"


def serving(node: NodeStatus) -> Judged:
    """Step 7: status read the node; a serving node's service is active, its /health answers
    200 and a release is recorded; a depot (no engine) was read."""
    if node.unreachable:
        return UNREACHABLE, node.error or "could not connect"
    if node.error:
        return FAIL, node.error
    if node.role not in SERVING_ROLES:
        return PASS, ""
    if node.service == "active" and node.health == "200" and node.release:
        return PASS, ""
    return FAIL, (
        f"service {node.service}, /health {node.health}, release {node.release or 'none'}"
    )
