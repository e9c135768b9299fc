"""`servefleet rollback`: the previous release on the selected hosts, by hand, then their
health gate (a rollout rolls back on its own: verbs/rollout.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from servefleet.core.errors import Exit
from servefleet.core.releases import NO_PREVIOUS
from servefleet.verbs import session as api
from servefleet.verbs.healthgate import gate, release_of
from servefleet.verbs.rollout_report import (
    ATTENTION,
    ROLLBACK,
    ROLLED_BACK,
    UNTOUCHED,
    HostRollout,
    RolloutReport,
)


def rollback(
    inventory: str,
    limit: list[str],
    data: dict | None,
    say: Callable[[str], None],
    everything: bool = False,
) -> RolloutReport:
    """`servefleet rollback`: the previous release on the selected hosts, then their gate.

    A glob or group that selects more hosts than were named one by one is refused unless
    `everything` (--all): `--limit '*'` would otherwise take the whole fleet back at once."""
    report = RolloutReport(f"rollback-{time.strftime('%Y%m%dT%H%M%S')}", wanted=ROLLED_BACK)
    with api.session(inventory, limit, data, deploy=ROLLBACK) as sess:
        gone = dict(sess.unreachable)
        selected = [h.name for h in sess.targets]
    named = set(selected) & set(limit)
    if len(selected) > len(named) and not everything:
        report.refused, report.message = (
            Exit.BAD_INPUT,
            (
                f"--limit {' '.join(limit)[:80]!r} selects {len(selected)} hosts "
                f"({', '.join(selected[:5])}{', ...' if len(selected) > 5 else ''}); rolling back more "
                f"hosts than were named one by one needs --all; nothing was changed"
            ),
        )
        return report
    if gone:  # as a rollout: all selected hosts or none
        report.refused, report.message = Exit.UNREACHABLE, api.cannot_reach(gone)
        return report
    outcomes = api.converge(inventory, ROLLBACK, limit, {**(data or {}), "previous_release": True})
    if not outcomes:
        report.refused, report.message = Exit.BAD_INPUT, f"--limit selects no host of {inventory}"
        return report
    for name, outcome in outcomes.items():
        report.hosts[name] = HostRollout(
            name,
            result=ROLLED_BACK if outcome.ok else ATTENTION,
            detail="" if outcome.ok else str(outcome.error),
        )
    # Nothing kept to go back to (a second rollback, say): the host was not touched; its gate
    # says whether it needs attention.
    nothing = {n for n, o in outcomes.items() if not o.ok and NO_PREVIOUS in str(o.error)}
    back = [n for n, o in outcomes.items() if o.ok or n in nothing]
    if back:
        with api.session(inventory, back, data, deploy=ROLLBACK) as sess:

            def check(host):
                return gate(host), release_of(host)

            for name, result in sess.each(check).items():
                rec = report.hosts[name]
                if isinstance(result, Exception):
                    rec.result, rec.detail = ATTENTION, str(result)
                    continue
                (ok, said, seconds), rel = result
                rec.gate_s, rec.to_release = round(seconds, 1), rel
                if not ok:
                    rec.result, rec.detail = ATTENTION, f"{rec.detail}; gate: {said}".lstrip("; ")
                elif name in nothing:
                    rec.result = UNTOUCHED
                    rec.detail = f"no previous release to go back to; serving {rel}, healthy"
                say(f"{name}: {rec.result}: {rel}")
    return report
