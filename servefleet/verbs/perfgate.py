"""The performance gate of `servefleet rollout`: the node-side bench (the field method,
files/bench/stream_bench.py, as `servefleet bench` runs it) with the small workload of the host's
data, just before a host is converged (the baseline) and once it passed its health gate on the
new release; a regression beyond the data's thresholds fails the host like a failed health check.

The figures go into the node's release records (core.releases.Release.perf): the baseline on the
release served before, the gate's figures on the new one (kept as the release rolled back from
when the gate failed). The baseline also travels in the rollout marker, so that a rerun of an
interrupted rollout compares with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from servefleet.core import perf, records
from servefleet.core.layout import NodeLayout
from servefleet.core.releases import Releases, with_perf
from servefleet.facts.releases import NodeReleases
from servefleet.operations.files import put
from servefleet.operations.node import run
from servefleet.verbs import metrics
from servefleet.verbs.bench import bench_host

OFF_BY_FLAG = "off (--no-perf-gate)"
OFF_BY_DATA = "off (perf_gate = false in this host's data)"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_releases(host) -> Releases:
    """releases.json as it is now (not a fact: the gate writes it during one session)."""
    path = NodeLayout.of(host.data).releases_file
    ok, out, _ = run(host, records.read_command(path))
    if not ok:
        return Releases(unreadable=f"{path} could not be read")
    try:
        return Releases.loads(records.from_node(out.splitlines(), "the release records"))
    except records.RecordError as exc:
        return Releases(unreadable=str(exc))


def keep(host, figures: perf.Figures) -> bool:
    """The figures on the node's current release record; False when there is none."""
    kept = read_releases(host)
    if kept.current is None or kept.unreadable:
        return False
    updated = with_perf(kept, kept.current.id, figures.to_json())
    path = NodeLayout.of(host.data).releases_file
    kept_now = updated is not None and put(host.state, host, path, updated.dumps().encode())
    if kept_now:
        metrics.refresh(host)  # the gate's figures of each release, in the textfile
    return kept_now


def serving_unit(host) -> str | None:
    """The unit the host's current release runs (whose CPU waits the bench measures)."""
    records = host.get_fact(NodeReleases, path=NodeLayout.of(host.data.dict()).releases_file)
    return records.current.unit if records.current else None


def measure(host, kind: str, rollout_id: str, unit: str | None = None) -> perf.Figures | str:
    """One measurement with the host's gate workload: its figures, or why it failed."""
    settings = perf.Settings.of(host.data.dict())
    w = settings.workload
    started = time.monotonic()
    res = bench_host(host, w.runs, w.prompt_tokens, w.max_tokens, unit)
    if not res.ok:
        return f"the bench failed: {res.error}"
    raw = {
        "median_decode_tok_s": res.median_decode_tok_s,
        "median_ttft_s": res.median_ttft_s,
        "median_own_decode_tok_s": res.median_own_decode_tok_s,
        "median_own_ttft_s": res.median_own_ttft_s,
        "runs": res.runs,
    }
    return perf.figures(raw, w, _now(), kind, rollout_id, time.monotonic() - started)


class PerfGate:
    """Baselines before the converge, the check after the health gate, for one rollout."""

    def __init__(self, rollout_id: str, enabled: bool, say: Callable[[str], None]):
        self.rollout_id, self.enabled, self.say = rollout_id, enabled, say
        self.baselines: dict[str, perf.Figures] = {}
        self.off: dict[str, str] = {}  # name -> why this host has no performance gate
        self.seconds: dict[str, float] = {}  # name -> what the gate cost this host
        self.again: dict[str, perf.Figures] = {}  # name -> the previous release measured again

    def applies(self, host) -> bool:
        if not self.enabled:
            self.off[host.name] = OFF_BY_FLAG
        elif not perf.Settings.of(host.data.dict()).enabled:
            self.off[host.name] = OFF_BY_DATA
        return host.name not in self.off

    def resume(self, name: str, baseline: dict | None) -> None:
        """The baseline an interrupted rollout measured (its marker), used again."""
        fig = perf.Figures.from_json(baseline)
        if fig is not None:
            self.baselines[name] = fig

    def baseline(self, sess, names: list[str], batch: str = "batch") -> None:
        """Measure the hosts about to be converged (those gated, without a baseline yet), and
        keep the figures on the release they serve now."""

        def one(host):
            if not self.applies(host) or host.name in self.baselines:
                return None
            fig = measure(host, "baseline", self.rollout_id, serving_unit(host))
            if isinstance(fig, perf.Figures):
                keep(host, fig)
            return fig

        todo = [h for h in sess.targets if h.name in names]
        benched = [h.name for h in todo if self.applies(h) and h.name not in self.baselines]
        if benched:
            self.say(
                f"{batch}: {', '.join(benched)}: benching the release serving now "
                f"(performance gate baseline)"
            )
        for name, fig in sess.each(one, todo).items():
            if isinstance(fig, perf.Figures):
                self.baselines[name] = fig
                self.seconds[name] = self.seconds.get(name, 0.0) + fig.seconds
                self.say(f"{name}: baseline {fig.short}")
            elif fig is not None:  # no baseline: this host is gated on its health only
                why = fig if isinstance(fig, str) else f"{type(fig).__name__}: {fig}"
                self.off[name] = f"off (no baseline: {why})"
                self.say(f"{name}: performance gate {self.off[name]}")

    def check(
        self, sess, names: list[str], against: dict[str, perf.Figures] | None = None
    ) -> dict[str, tuple[str, str, perf.Figures | None]]:
        """(verdict, what it said, the figures that counted) for each host of `names` that has a
        baseline (or, given `against`, the figures there: the previous release measured again);
        the verdict is perf.PASS, perf.FAIL or perf.INCONCLUSIVE (see decide())."""
        baselines = self.baselines if against is None else against

        def one(host):
            th = perf.Settings.of(host.data.dict()).thresholds
            unit = serving_unit(host)
            state, said, after, spent = decide(
                baselines[host.name],
                th,
                lambda: measure(host, "gate", self.rollout_id, unit),
                lambda line: self.say(f"{host.name}: {line}"),
            )
            if after is not None:
                after = replace(after, verdict=said)
                keep(host, after)
            return state, said, after, spent

        todo = [h for h in sess.targets if h.name in names and h.name in baselines]
        out: dict[str, tuple[str, str, perf.Figures | None]] = {}
        for name, res in sess.each(one, todo).items():
            if isinstance(res, Exception):
                out[name] = (
                    perf.INCONCLUSIVE,
                    f"performance gate inconclusive: {type(res).__name__}: {res}",
                    None,
                )
                continue
            state, said, after, spent = res
            self.seconds[name] = round(self.seconds.get(name, 0.0) + spent, 1)
            out[name] = (state, said, after)
        return out

    def keep_verdicts(self, sess, verdicts: dict[str, tuple[perf.Figures, str]]) -> None:
        """The new release's figures on its record again, with the whole rule's verdict."""

        def one(host):
            fig, said = verdicts[host.name]
            keep(host, replace(fig, verdict=said))

        sess.each(one, [h for h in sess.targets if h.name in verdicts])

    def bracket(self, sess, after: dict[str, perf.Figures]) -> dict[str, tuple[str, str]]:
        """After a failed gate and the rollback: the previous release measured again on each
        host of `after` (the new release's figures that failed), and (verdict, what it said)
        for each. See bracket()."""

        def one(host):
            th = perf.Settings.of(host.data.dict()).thresholds
            unit = serving_unit(host)
            again = [measure(host, "baseline-again", self.rollout_id, unit) for _ in range(2)]
            now = measured_again(again)
            if now is not None:
                self.again[host.name] = now
            return bracket(self.baselines[host.name], again, after[host.name], th)

        todo = [h for h in sess.targets if h.name in after and h.name in self.baselines]
        out = {}
        for name, res in sess.each(one, todo).items():
            out[name] = (
                res
                if not isinstance(res, Exception)
                else (
                    perf.FAIL,
                    f"the previous release could not be measured again: "
                    f"{type(res).__name__}: {res}",
                )
            )
        return out


def measured_again(again: list) -> perf.Figures | None:
    """The previous release's speed from its measurements after the rollback: the best of
    the two, the one that worked, or None where neither did."""
    figs = [f for f in again if isinstance(f, perf.Figures)]
    if not figs:
        return None
    return perf.best(*figs) if len(figs) == 2 else figs[0]


def bracket(
    before: perf.Figures, again: list, after: perf.Figures, th: perf.Thresholds
) -> tuple[str, str]:
    """After a failed gate and the rollback: is the new release slower (perf.FAIL), did the
    node slow down (perf.PASS), or can the figures not tell (perf.INCONCLUSIVE)?

    The gate compares the new release with the previous one measured *before* it. Load that
    starts on the node in between (a compile, a neighbour's job) makes the new release look
    slower in both of its measurements. So a release the gate failed is judged once more,
    after the rollback, against the previous release measured *again* (the best of two, on the
    node as it is now): a slower release is slower than its predecessor on both sides of it in
    time; if the previous release is now just as slow, it was the node. And where the previous
    release itself measured differently before and after by more than a threshold, the node's
    speed moved as much as the gate tries to see, and unless the new release is slower than
    that swing too, the verdict is inconclusive, not a rollback. Only a figure the new release
    failed on against both measurements counts (a decode swing says nothing of TTFT).
    A previous release that cannot be measured again leaves the verdict as it was (the safe
    one)."""
    now = measured_again(again)
    if now is None:
        why = next((f for f in again if isinstance(f, str)), "not measured")
        return perf.FAIL, f"the previous release could not be measured again: {why}"
    verdict = perf.compare(now, after, th)
    if not verdict.failed:
        return perf.PASS, (
            f"against the previous release measured again {verdict.text} (before the "
            f"upgrade it measured {before.short}): the node slowed down, not the release"
        )
    # A figure the new release failed on against both measurements of the previous one, each
    # against that release's own swing: slower than the swing is slower whatever the node did.
    both = [n for n in verdict.failed if n in perf.compare(before, after, th).failed]
    moved = set(perf.compare(before, now, th).failed) | set(perf.compare(now, before, th).failed)
    if not any(n not in moved or perf.beyond_swing(n, before, now, after) for n in both):
        return perf.INCONCLUSIVE, (
            f"the previous release measured {before.short} before the upgrade and "
            f"{now.short} after it: the node's own speed moved more than a threshold and more "
            f"than the new release is slower, so it cannot be judged slower"
        )
    return perf.FAIL, f"slower than the previous release measured again too ({now.short})"


# Joins the verdict of a release measured once more to the earlier ones (verbs/rollout_again.py).
ONCE_MORE = (
    "; upgraded again and measured once more, against the previous release measured again; "
    "the first verdict: "
)

GATE_SAID = {
    perf.PASS: "performance gate passed: ",
    perf.FAIL: "performance gate failed: ",
    perf.INCONCLUSIVE: "performance gate inconclusive: ",
}


def decide(
    before: perf.Figures,
    th: perf.Thresholds,
    measure_once: Callable[[], perf.Figures | str],
    say: Callable[[str], None],
) -> tuple[str, str, perf.Figures | None, float]:
    """The gate's rule for one host: (verdict, what it said, the figures that counted, seconds).

    A measurement that passes clearly passes. Anything else (a figure beyond its threshold or
    within recheck_pct points of it, a figure not measured, a bench that failed) is measured once
    more, and the release's speed is the best of the two (perf.best): node noise only ever slows
    requests down, so a real regression is slow in both, while a busy moment or the first
    requests after a restart are slow in one. The best of two is then judged by the thresholds
    alone; if a figure still cannot be measured the verdict is inconclusive, never a pass."""
    spent, first = 0.0, measure_once()
    if isinstance(first, perf.Figures):
        spent += first.seconds
        verdict = perf.compare(before, first, th)
        if verdict.state == perf.PASS:
            return perf.PASS, GATE_SAID[perf.PASS] + verdict.text, first, spent
        say(f"{verdict.state} ({verdict.text}): measuring again")
    else:
        say(f"{first}: measuring again")
    second = measure_once()
    if isinstance(second, perf.Figures):
        spent += second.seconds
    figs = [f for f in (first, second) if isinstance(f, perf.Figures)]
    if not figs:
        return perf.INCONCLUSIVE, GATE_SAID[perf.INCONCLUSIVE] + str(second), None, spent
    after = perf.best(*figs) if len(figs) == 2 else figs[0]
    verdict = perf.compare(before, after, th)
    state = (
        perf.FAIL
        if verdict.failed
        else perf.INCONCLUSIVE
        if verdict.state == perf.INCONCLUSIVE or len(figs) < 2
        else perf.PASS
    )
    failed_once = [f for f in (first, second) if isinstance(f, str)]
    text = verdict.text + (
        f"; the other measurement: {failed_once[0]}" if failed_once else "; best of 2 measurements"
    )
    return state, GATE_SAID[state] + text, after, spent


def judge(
    before: perf.Figures,
    th: perf.Thresholds,
    measure_new: Callable[[], perf.Figures | str],
    measure_previous: Callable[[], perf.Figures | str],
    say: Callable[[str], None] = lambda line: None,
    measure_new_again: Callable[[], perf.Figures | str] | None = None,
) -> tuple[str, str]:
    """The whole rule for one host, as a rollout applies it: decide() on the new release, then,
    where it failed, bracket() on the previous release measured twice after the rollback
    (measure_previous is only called then), then, where that does not clear the new release
    (slower, or the previous release swung: inconclusive), decide() once more on the new
    release served again (measure_new_again; see verbs/rollout_again.py), against the previous
    release measured again. (verdict, what it said); the verdict is perf.PASS (also where the
    node slowed, not the release), perf.FAIL or perf.INCONCLUSIVE. The rollout runs the stages
    itself, a batch at a time, with the switches between them; benchmarks/perf_gate.py
    measures the rule's error rates through this function."""
    state, said, after, _ = decide(before, th, measure_new, say)
    if state != perf.FAIL or after is None:
        return state, said
    again = [measure_previous(), measure_previous()]
    state, why = bracket(before, again, after, th)
    said = f"{said}; {why}"
    now = measured_again(again)
    if state == perf.PASS or now is None or measure_new_again is None:
        return state, said
    # Against the previous release's measurement next to it in time, not the first baseline.
    state, said_again, _, _ = decide(now, th, measure_new_again, say)
    return state, f"{said_again}{ONCE_MORE}{said}"
