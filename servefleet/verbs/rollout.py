"""Rolling upgrades with health gates and automatic rollback (`servefleet rollout`); going back
on purpose is verbs/rollback.py.

1. Preflight: the data is validated and every host of the deploy's role is reachable and
   healthy (an interrupted rollout's host is finished now), or nothing is changed.
2. Batch by batch: mark the hosts (state/rollout.json), converge the batch, then gate every host
   whether or not anything restarted: the recipe's health check, the chat smoke, for vLLM the
   KV comparison, `health_settle_s` of staying healthy; then the performance gate
   (verbs/perfgate.py) against a baseline measured just before the converge. A failed converge
   or gate rolls the host back to its previous release (deploys/rollback.py) and gates it
   again; with no previous release it needs attention. A host the performance gate failed
   is judged once more (verbs/rollout_again.py): the previous release measured again, the new
   one served and measured again, before it stays rolled back.
3. More failed hosts than --max-failures stops the rollout; the rest are left untouched.
4. Each host keeps what the rollout did there (state/last-rollout.json) for `servefleet report`.

The state lives on the nodes (release records, the marker), so a rerun from any operator
machine finishes an interrupted rollout or rolls back.
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Callable

from servefleet.core import perf
from servefleet.core.errors import Exit
from servefleet.core.layout import NodeLayout
from servefleet.core.records import Unreadable
from servefleet.core.releases import RolloutMarker
from servefleet.facts.releases import RolloutMarkerFact
from servefleet.fleet import registry
from servefleet.fleet.data import recipe_of
from servefleet.operations.files import put
from servefleet.operations.node import run
from servefleet.verbs import rollout_record, session as api
from servefleet.verbs.healthgate import gate, release_of
from servefleet.verbs.perfgate import OFF_BY_FLAG, PerfGate
from servefleet.verbs.rollout_again import upgrade_again
from servefleet.verbs.rollout_report import (
    ATTENTION,
    INCONCLUSIVE,
    ROLLBACK,
    ROLLED_BACK,
    UNCHANGED,
    UPGRADED,
    HostRollout,
    RolloutReport,
    batch_size,
    batches,
    max_failures_of,
)


def _write_marker(host, marker: RolloutMarker | None) -> None:
    path = NodeLayout.of(host.data).rollout_marker
    if marker is None:
        run(host, f"rm -f {shlex.quote(path)}")
    else:
        put(host.state, host, path, marker.dumps().encode())


class Rollout:
    def __init__(
        self,
        inventory: str,
        deploy: str,
        batch: str,
        max_failures: int,
        limit: list[str] | None,
        data: dict | None,
        say: Callable[[str], None],
        perf_gate: bool = True,
    ):
        batch_size(batch)  # refused here, before any host is reached
        self.inventory, self.deploy, self.batch = inventory, deploy, batch
        self.max_failures = max_failures_of(max_failures)
        self.limit, self.data, self.say = limit, data, say
        self.recipe = recipe_of(deploy)
        self.engine = registry.serving_engine(self.recipe, f"rollout: {deploy}")
        self.report = RolloutReport(f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}")
        self.perf = PerfGate(self.report.rollout_id, perf_gate, say)
        self.resumed: dict[str, RolloutMarker] = {}

    def session(self, names: list[str] | None = None):
        return api.session(
            self.inventory,
            names if names is not None else self.limit,
            self.data,
            deploy=self.deploy,
        )

    def preflight(self) -> list[str] | None:
        """The hosts to roll out to, in inventory order; None (and the reason) to refuse."""
        with self.session() as sess:
            targets = [h for h in sess.targets if registry.applies(self.recipe, h.groups)]
            names = [h.name for h in targets]
            if not names:
                self.report.refused, self.report.message = (
                    Exit.BAD_INPUT,
                    (f"no {self.engine.title} host selected in {self.inventory}"),
                )
                return None
            gone = {n: why for n, why in sess.unreachable.items() if n in names}
            if gone:
                self.report.refused, self.report.message = (
                    Exit.UNREACHABLE,
                    api.cannot_reach(gone),
                )
                return None

            def look(host):
                marker = host.get_fact(
                    RolloutMarkerFact, path=NodeLayout.of(host.data).rollout_marker
                )
                if isinstance(marker, Unreadable):  # never guess which phase it was in
                    return False, f"{marker}; the host was not touched"
                if marker is not None:  # an interrupted rollout: finished or rolled back now
                    self.resumed[host.name] = marker
                    return True, f"resuming rollout {marker.rollout_id} ({marker.phase})"
                ok, said, _ = gate(host, settle_s=0, timeout_s=30)
                return ok, said

            sick = {}
            for name, result in sess.each(look, targets).items():
                if isinstance(result, Exception):
                    sick[name] = f"{type(result).__name__}: {result}"
                elif not result[0]:
                    sick[name] = result[1]
                elif result[1]:
                    self.say(f"{name}: {result[1]}")
            if sick:
                self.report.refused, self.report.message = (
                    Exit.DIFFERS,
                    (
                        "not healthy before the rollout: "
                        + "; ".join(f"{n}: {w}" for n, w in sick.items())
                        + "; nothing was changed"
                    ),
                )
                return None
            for host in targets:
                self.report.hosts[host.name] = HostRollout(host.name)
            for name, rel in sess.each(release_of, targets).items():
                self.report.hosts[name].from_release = None if isinstance(rel, Exception) else rel
            for name, marker in self.resumed.items():  # what it was rolled out from, and when
                self.report.hosts[name].from_release = (
                    marker.from_release or self.report.hosts[name].from_release
                )
                self.perf.resume(name, marker.extra.get("baseline"))
        return names

    def _mark(self, names: list[str], phase: str | None) -> None:
        if not names:  # an empty --limit would select every host of the inventory
            return
        with self.session(names) as sess:

            def mark(host):
                rec = self.report.hosts[host.name]
                base = self.perf.baselines.get(host.name)
                _write_marker(
                    host,
                    None
                    if phase is None
                    else RolloutMarker(
                        self.report.rollout_id,
                        "",
                        phase,
                        rec.from_release,
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        {"baseline": base.to_json()} if base else {},
                    ),
                )

            sess.each(mark)

    def _gate(self, names: list[str]) -> dict[str, tuple[bool, str, float]]:
        with self.session(names) as sess:
            results = sess.each(gate)
            releases = sess.each(release_of)
        for name, rel in releases.items():
            if not isinstance(rel, Exception):
                self.report.hosts[name].to_release = rel
        return {
            n: (r if not isinstance(r, Exception) else (False, str(r), 0.0))
            for n, r in results.items()
        }

    def _perf_gate(self, healthy: list[str]) -> tuple[list[str], list[str]]:
        """The performance gate of the hosts that passed their health gate: (those it failed,
        those it could not judge)."""
        for name, rec in self.report.hosts.items():
            base = self.perf.baselines.get(name)
            rec.perf = self.perf.off.get(name, rec.perf)
            rec.perf_before = base.to_json() if base else rec.perf_before
            rec.perf_s = self.perf.seconds.get(name, rec.perf_s)
        same = [
            n
            for n in healthy
            if n in self.perf.baselines
            and self.report.hosts[n].from_release == self.report.hosts[n].to_release
        ]
        for name in same:
            self.report.hosts[name].perf = "not needed: the release did not change"
        todo = [
            n
            for n in healthy
            if n in self.perf.baselines and n not in same and n not in self.perf.off
        ]
        if not todo:
            return [], []
        with self.session(todo) as sess:
            results = self.perf.check(sess, todo)
        failed, held = list[str](), list[str]()
        for name in todo:
            rec = self.report.hosts[name]
            state, said, after = results.get(
                name, (perf.INCONCLUSIVE, "performance gate inconclusive: not run", None)
            )
            rec.perf, rec.perf_after = said, after.to_json() if after else None
            rec.perf_s = self.perf.seconds.get(name)
            if state != perf.PASS:
                rec.detail = "; ".join(x for x in (rec.detail, said) if x)
                (failed if state == perf.FAIL else held).append(name)
        return failed, held

    def _rollback(self, names: list[str], slower: list[str]) -> None:
        """Serve the previous release again on `names`. The hosts in `slower` run the new
        release healthy (they failed the performance gate): rollback.py would keep a healthy
        current release, so they are sent back to the previous one explicitly."""
        self.say(f"rolling back {', '.join(names)} to the previous release")
        self._mark(names, "rolling-back")
        started = time.monotonic()
        outcomes = {}
        for part, force in (
            ([n for n in names if n not in slower], False),
            ([n for n in names if n in slower], True),
        ):
            if part:
                outcomes.update(
                    api.converge(
                        self.inventory,
                        ROLLBACK,
                        part,
                        {**(self.data or {}), "previous_release": force},
                    )
                )
        took = time.monotonic() - started
        back_ok = [n for n in names if outcomes.get(n) and outcomes[n].ok]
        gates = self._gate(back_ok) if back_ok else {}
        for name in names:
            rec = self.report.hosts[name]
            rec.rollback_s = round(took + gates.get(name, (0, "", 0.0))[2], 1)
            if name in gates and gates[name][0]:
                rec.result = ROLLED_BACK
            else:
                rec.result = ATTENTION
                why = (
                    outcomes[name].error
                    if name in outcomes and not outcomes[name].ok
                    else gates.get(name, (False, "no gate", 0))[1]
                )
                rec.detail = f"{rec.detail}; rollback: {why}".strip("; ")
        self._mark([n for n in names if self.report.hosts[n].result == ROLLED_BACK], None)

    def run(self) -> RolloutReport:
        names = self.preflight()
        if names is None:
            return self.report
        groups = batches(names, self.batch)
        failures = 0
        for number, group in enumerate(groups, 1):
            if self.perf.enabled:
                with self.session(group) as sess:
                    self.perf.baseline(sess, group, f"batch {number}/{len(groups)}")
            else:
                self.perf.off.update({n: OFF_BY_FLAG for n in group})
            self.say(f"batch {number}/{len(groups)}: {', '.join(group)}: converging {self.deploy}")
            self._mark(group, "converging")
            started = time.monotonic()
            outcomes = api.converge(self.inventory, self.deploy, group, self.data)
            took = round(time.monotonic() - started, 1)
            failed, slower = list[str](), list[str]()
            for name in group:
                rec, outcome = self.report.hosts[name], outcomes.get(name)
                rec.converge_s = took
                if outcome is None or not outcome.ok:
                    rec.detail = f"converge: {outcome.error if outcome else 'not run'}"
                    failed.append(name)
            passing = [n for n in group if n not in failed]
            if passing:
                self.say(f"batch {number}/{len(groups)}: gating {', '.join(passing)}")
                self._mark(passing, "gating")
                healthy = []
                for name, (ok, said, seconds) in self._gate(passing).items():
                    rec = self.report.hosts[name]
                    rec.gate_s, rec.detail = round(seconds, 1), said
                    if ok:
                        healthy.append(name)
                    else:
                        rec.detail = f"gate: {said}"
                        failed.append(name)
                slower, held = self._perf_gate(healthy)
                failed += slower
                for name in healthy:
                    rec = self.report.hosts[name]
                    if name in held:
                        rec.result = INCONCLUSIVE
                        self.say(f"{name}: held on {rec.to_release}, healthy; {rec.perf}")
                    elif name not in failed and rec.from_release == rec.to_release:
                        rec.result = UNCHANGED  # the data asked for the release it serves
                        self.say(f"{name}: unchanged, {rec.to_release} (gate {rec.gate_s} s)")
                    elif name not in failed:
                        rec.result = UPGRADED
                        self.say(
                            f"{name}: upgraded to {rec.to_release} (gate {rec.gate_s} s)"
                            + "".join(f"; {x}" for x in (rec.detail, rec.perf) if x)
                        )
                self._mark([n for n in passing if n not in failed], None)
            for name in failed:
                self.say(f"{name}: failed: {self.report.hosts[name].detail}")
            if failed:
                self._rollback(failed, slower)
                upgraded_again = upgrade_again(self, slower)  # the node slowed, not the release
                failures += len(failed) - len(upgraded_again)
            if failures > self.max_failures:
                rest = [n for g in groups[number:] for n in g]
                self.report.message = (
                    f"stopped after {failures} failed host(s) (--max-failures "
                    f"{self.max_failures})" + (f"; untouched: {', '.join(rest)}" if rest else "")
                )
                break
        rollout_record.save(self.session, self.report, groups, self.say)  # for `report`
        return self.report
