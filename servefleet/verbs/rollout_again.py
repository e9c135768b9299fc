"""After the performance gate failed a host and it was rolled back: measure the previous release
again (perfgate.bracket) and, unless it was not the release at all, serve the new one again.

A node serves one release at a time, so the gate can only compare releases one after the other,
and load on the node (a compile, a neighbour's job, a busy hypervisor) comes and goes in windows
of seconds to minutes. The rule alternates the releases until a window cannot explain it:
- A (the baseline), B (the gate): B failed;
- rollback, A again: if A is now as slow as B was, the node slowed, not the release: B is
  served again and passes;
- otherwise (B slower than A on both sides of it, or A itself swung by more than B is slower)
  B is served again and measured once more (A B A B), against A measured again, the
  measurement next to it in time: each of B's windows is judged against the A beside it, so a
  release is rolled back only if it was slower than A before it, A after it, and A before its
  second window. An equally fast release is then rolled back only if load struck both of its
  windows and spared the A between them; a lucky first baseline (a quiet moment before the load
  began) cannot fail it twice. A slower release pays one more restart and measurement; a
  figure that still cannot be measured holds the host on the new release, inconclusive.
"""

from __future__ import annotations

from dataclasses import replace

from servefleet.core import perf
from servefleet.verbs import session as api
from servefleet.verbs.perfgate import ONCE_MORE
from servefleet.verbs.rollout_report import INCONCLUSIVE, ROLLED_BACK, UPGRADED

SAID = {
    perf.PASS: "performance gate passed ",
    perf.INCONCLUSIVE: "performance gate inconclusive: ",
}


def upgrade_again(ro, slower: list[str]) -> list[str]:
    """The hosts of `slower` (rolled back by the performance gate) judged once more, as the
    module says, on the Rollout `ro`. Returns those upgraded (or held) again; those the rule
    still finds slower are rolled back again."""
    back = {
        n: ro.report.hosts[n]
        for n in slower
        if ro.report.hosts[n].result == ROLLED_BACK and ro.report.hosts[n].perf_after
    }
    if not back:
        return []
    after = {n: f for n, rec in back.items() if (f := perf.Figures.from_json(rec.perf_after))}
    with ro.session(list(back)) as sess:
        judged = ro.perf.bracket(sess, after)
    passed: dict[str, tuple[str, str]] = {}  # upgraded again on the bracket's verdict
    retry: dict[str, str] = {}  # measured once more on the new release: what was said so far
    for name, (state, said) in judged.items():
        rec = back[name]
        first = rec.perf.removeprefix("performance gate ")
        if state == perf.PASS:
            passed[name] = (state, f"{SAID[state]}{said}; the first verdict: {first}")
        elif name in ro.perf.again:  # slower than the previous release, or it swung: once more
            retry[name] = f"{first}; {said}"
        else:  # the previous release could not be measured again: the rollback stands
            rec.perf = f"{rec.perf}; {said}"
            rec.detail = f"{rec.detail}; {said}"
    forward = [n for n in back if n in passed or n in retry]
    if not forward:
        return []
    if passed:
        ro.say(f"{', '.join(passed)}: not the release's fault: converging {ro.deploy} again")
    if retry:
        ro.say(
            f"{', '.join(retry)}: not faster than the previous release measured before and "
            f"after it: converging {ro.deploy} again to measure it once more"
        )
    ro._mark(forward, "converging")
    outcomes = api.converge(ro.inventory, ro.deploy, forward, ro.data)
    ok = [n for n in forward if outcomes.get(n) and outcomes[n].ok]
    gates = ro._gate(ok) if ok else {}
    up = [n for n in ok if gates[n][0]]
    figures = dict(after)  # the new release's figures each host's record keeps
    again = [n for n in up if n in retry]
    if again:
        with ro.session(again) as sess:
            checked = ro.perf.check(sess, again, against=ro.perf.again)
        for name in again:
            state, said, fig = checked.get(
                name, (perf.INCONCLUSIVE, "performance gate inconclusive: not run", None)
            )
            passed[name] = (state, f"{said}{ONCE_MORE}{retry[name]}")
            figures[name] = fig or figures[name]
    slower_again = [n for n in again if passed[n][0] == perf.FAIL]
    for name in forward:
        rec = back[name]
        if name in slower_again:  # the first verdict in the detail becomes the whole story
            first, rec.perf = rec.perf, passed[name][1]
            rec.detail = (
                rec.detail.replace(first, rec.perf)
                if first in rec.detail
                else f"{rec.detail}; {rec.perf}"
            )
        elif name in up:
            state, said = passed[name]
            held = state == perf.INCONCLUSIVE  # on the new release, reported apart
            rec.result, rec.again, rec.perf = INCONCLUSIVE if held else UPGRADED, True, said
            rec.detail = f"gate: {gates[name][1]}"
            ro.say(f"{name}: {'held on' if held else 'upgraded to'} {rec.to_release} again; {said}")
        else:
            why = gates[name][1] if name in gates else getattr(outcomes.get(name), "error", "")
            said = passed[name][1] if name in passed else retry[name]
            rec.detail = f"{rec.detail}; {said}; converging again: {why or 'not run'}"
    if up:  # each verdict with the figures it judged, on the new release's record
        with ro.session(up) as sess:
            ro.perf.keep_verdicts(sess, {n: (figures[n], back[n].perf) for n in up})
        for name in up:
            back[name].perf_after = replace(figures[name], verdict=back[name].perf).to_json()
    kept = [n for n in up if n not in slower_again]
    ro._mark(kept, None)
    if len(kept) < len(forward):
        ro._rollback([n for n in forward if n not in kept], slower_again)
    return kept
