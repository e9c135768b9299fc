"""The rollout's performance gate, off the testbed: the comparison with the baseline (both values
named, borderline results re-measured), the workload and thresholds from data, the figures in the
release records (not part of a release's id: a converge twice changes nothing) and the reports."""

from dataclasses import replace

import pytest

from servefleet.cli.bench import render_compare
from servefleet.cli.rollout import render
from servefleet.core import perf
from servefleet.core.groupdata import load_group
from servefleet.core.releases import Release, Releases, record, rollback, with_perf
from servefleet.verbs.bench import Comparison
from servefleet.verbs.rollout import HostRollout, RolloutReport

TH = perf.Thresholds(decode_drop_pct=10, ttft_rise_pct=25, recheck_pct=5)


def fig(decode, ttft, **kw) -> perf.Figures:
    return perf.Figures(decode, ttft, **kw)


def test_as_fast_passes_and_names_both_figures():
    v = perf.compare(fig(40.0, 0.200), fig(39.0, 0.210), TH)
    assert v.state == perf.PASS and not v.failed
    assert v.lines == ("decode 40.0 -> 39.0 tok/s (-2.5 %, limit -10 %)",
                       "TTFT 0.200 -> 0.210 s (+5.0 %, limit +25 %)")


def test_half_the_decode_speed_fails_at_once_with_both_values():
    v = perf.compare(fig(40.0, 0.200), fig(20.0, 0.210), TH)
    assert v.state == perf.FAIL and v.failed == ("decode",)
    assert "decode 40.0 -> 20.0 tok/s (-50.0 %, limit -10 %) FAILED" in v.text


def test_a_slower_first_token_fails():
    v = perf.compare(fig(40.0, 0.200), fig(40.0, 0.400), TH)
    assert v.failed == ("TTFT",) and "TTFT 0.200 -> 0.400 s (+100.0 %, limit +25 %) FAILED" \
        in v.text


@pytest.mark.parametrize("after,state", [
    (36.5, perf.BORDERLINE),  # -8.75 %: within 5 points of -10 %, passing
    (34.5, perf.BORDERLINE),  # -13.75 %: within 5 points, failing: measured again first
    (33.0, perf.FAIL),  # -17.5 %: clearly beyond
    (38.5, perf.PASS),  # -3.75 %: clearly within
])
def test_a_result_near_a_threshold_is_borderline(after, state):
    assert perf.compare(fig(40.0, 0.2), fig(after, 0.2), TH).state == state


def test_a_threshold_set_to_none_is_not_checked():
    th = perf.Thresholds(decode_drop_pct=None, ttft_rise_pct=25, recheck_pct=0)
    v = perf.compare(fig(40.0, 0.2), fig(4.0, 0.2), th)
    assert v.state == perf.PASS and len(v.lines) == 1 and v.lines[0].startswith("TTFT")


def test_no_decode_figure_is_said_not_compared():
    v = perf.compare(fig(None, 0.2), fig(30.0, 0.2), TH)
    assert "decode not compared" in v.text and v.state == perf.PASS


def test_settings_come_from_the_data_defaults():
    data = load_group("all")
    s = perf.Settings.of(data)
    assert s.enabled and s.workload == perf.Workload(data["perf_gate_runs"],
                                                     data["perf_gate_prompt_tokens"],
                                                     data["perf_gate_max_tokens"])
    assert (s.thresholds.decode_drop_pct, s.thresholds.ttft_rise_pct) == (10, 25)
    assert load_group("testbed_spark")["perf_gate"] is False  # the stand-in's speed is no speed


def test_figures_from_the_bench_and_back():
    raw = {"median_decode_tok_s": 41.5, "median_ttft_s": 0.12,
           "runs": [{"decode_tok_s": 41.0, "ttft_s": 0.11}, {"decode_tok_s": 42.0, "ttft_s": 0.13}]}
    f = perf.figures(raw, perf.Workload(2, 256, 64), "2026-12-02T21:00:00Z", "gate", "r1", 3.456)
    doc = f.to_json()
    assert doc["workload"] == {"runs": 2, "prompt_tokens": 256, "max_tokens": 64}
    assert doc["runs"] == [[41.0, 0.11], [42.0, 0.13]] and doc["seconds"] == 3.46
    assert perf.Figures.from_json(doc) == replace(f, runs=[[41.0, 0.11], [42.0, 0.13]])
    assert perf.Figures.from_json({"nonsense": 1}) is None
    assert perf.short(doc) == "41.5 tok/s, TTFT 0.120 s" and perf.short(None) is None


def test_cv():
    assert perf.cv_pct([10.0, 10.0, 10.0]) == 0
    assert round(perf.cv_pct([9.0, 10.0, 11.0]), 1) == 10.0
    assert perf.cv_pct([1.0]) is None


def release(version: str, **kw) -> Release:
    return Release("llama.cpp", version, f"/opt/servefleet/llama.cpp/{version}", "u.service",
                   "[Service]\n", "org/m", "main", "a" * 40, "/m", "d", **kw)


def test_figures_are_not_part_of_a_releases_id():
    plain = release("b1")
    measured = replace(plain, perf=fig(40.0, 0.2).to_json())
    assert measured.id == plain.id
    # ...so the recipe, recording the same release again, finds it recorded: no change.
    records = Releases(measured)
    assert record(records, plain, keep=2) == (records, [])


def test_figures_move_with_their_release():
    old = replace(release("b1"), perf=fig(40.0, 0.2, kind="baseline").to_json())
    records, _ = record(Releases(old), release("b2"), keep=2)
    assert records.previous[0].perf["kind"] == "baseline" and records.current.perf is None
    gated = with_perf(records, records.current.id, fig(20.0, 0.2, kind="gate").to_json())
    assert gated.current.perf["decode_tok_s"] == 20.0
    back = rollback(gated)  # the failed release keeps its figures as the one rolled back from
    assert back.current.perf["kind"] == "baseline"
    assert back.rolled_back_from.perf["decode_tok_s"] == 20.0
    assert Releases.from_json(back.to_json()) == back
    # Recorded again later, a kept release keeps its last figures.
    again, _ = record(Releases(release("b3"), (old,)), release("b1"), keep=2)
    assert again.current.perf["kind"] == "baseline"
    assert with_perf(records, "nope", {}) is None


def test_the_rollout_report_shows_the_failed_figure_with_both_values():
    said = "performance gate failed: decode 40.0 -> 20.0 tok/s (-50.0 %, limit -10 %) FAILED"
    report = RolloutReport("r1", {"rtx4090-1": HostRollout(
        "rtx4090-1", "llama.cpp b1 (x)", "llama.cpp b2 (y)", "rolled back", 30.0, 5.0, 4.0,
        said, perf_s=6.0, perf=said, perf_after=fig(20.0, 0.2).to_json())})
    out = render(report)
    assert f"rtx4090-1: {said}" in out and "perf s" in out
    assert report.to_dict()["hosts"]["rtx4090-1"]["perf_after"]["decode_tok_s"] == 20.0


def test_bench_compare_report():
    rows = [Comparison("rtx4090-1", True, None, "llama.cpp b2", fig(20.0, 0.2).to_json(),
                       "llama.cpp b1", fig(40.0, 0.2).to_json(),
                       ["decode 40.0 -> 20.0 tok/s (-50.0 %, limit -10 %) FAILED"], True),
            Comparison("rtx4090-5", False, "connection refused")]
    out = render_compare(rows)
    assert "slower" in out and "connection refused" in out and "40.0" in out and "20.0" in out


class FakeHost:
    def __init__(self, name, **data):
        self.name = name
        self.data = type("D", (), {"dict": lambda _self: {**load_group("all"), **data}})()


class FakeSession:
    def __init__(self, hosts):
        self.targets = hosts

    def each(self, func, hosts=None):
        out = {}
        for h in hosts if hosts is not None else self.targets:
            try:
                out[h.name] = func(h)
            except Exception as exc:  # as the real session: per host
                out[h.name] = exc
        return out


@pytest.fixture
def gate(monkeypatch):
    """A PerfGate whose measurements come from a script: {host: [figures or error, ...]}."""
    from servefleet.verbs import perfgate

    script, kept, said = {}, [], []
    monkeypatch.setattr(perfgate, "measure", lambda host, kind, rid: (
        lambda f: replace(f, kind=kind, rollout=rid) if isinstance(f, perf.Figures) else f)(
        script[host.name].pop(0)))
    monkeypatch.setattr(perfgate, "keep", lambda host, f: kept.append((host.name, f)) or True)
    g = perfgate.PerfGate("r1", True, said.append)
    return g, script, kept, said


def test_the_gate_fails_a_slower_host_and_passes_an_equal_one(gate):
    g, script, kept, _ = gate
    a, b = FakeHost("a"), FakeHost("b")
    script.update(a=[fig(40.0, 0.2, seconds=2.0), fig(20.0, 0.2, seconds=2.5)],
                  b=[fig(40.0, 0.2, seconds=2.0), fig(39.5, 0.2, seconds=2.0)])
    sess = FakeSession([a, b])
    g.baseline(sess, ["a", "b"])
    assert [k for _, k in ((n, f.kind) for n, f in kept)] == ["baseline", "baseline"]
    out = g.check(sess, ["a", "b"])
    assert out["a"][0] is False and "decode 40.0 -> 20.0 tok/s (-50.0 %, limit -10 %) FAILED" \
        in out["a"][1]
    assert out["b"][0] is True and out["b"][1].startswith("performance gate passed")
    assert kept[-1][1].verdict or kept[-2][1].verdict  # the gate's figures carry the verdict
    assert g.seconds == {"a": 4.5, "b": 4.0}


def test_a_borderline_result_is_measured_once_more_and_that_counts(gate):
    g, script, _, said = gate
    a = FakeHost("a")
    script["a"] = [fig(40.0, 0.2), fig(35.0, 0.2), fig(39.0, 0.2)]  # -12.5 %: borderline
    sess = FakeSession([a])
    g.baseline(sess, ["a"])
    ok, text, after = g.check(sess, ["a"])["a"]
    assert ok and after.decode_tok_s == 39.0 and not script["a"]
    assert any("borderline" in line for line in said)
    script["a"] = [fig(35.5, 0.2), fig(34.0, 0.2)]  # borderline, then still beyond: fails
    ok, text, after = g.check(sess, ["a"])["a"]
    assert not ok and after.decode_tok_s == 34.0


def test_the_gate_is_off_by_flag_by_data_or_without_a_baseline(gate, monkeypatch):
    from servefleet.verbs import perfgate

    g, script, kept, _ = gate
    hosts = [FakeHost("off", perf_gate=False), FakeHost("broken")]
    script["broken"] = ["the bench failed: HTTP 401"]
    g.baseline(FakeSession(hosts), ["off", "broken"])
    assert g.off == {"off": perfgate.OFF_BY_DATA,
                     "broken": "off (no baseline: the bench failed: HTTP 401)"}
    assert not g.baselines and not kept
    flagless = perfgate.PerfGate("r2", False, lambda line: None)
    flagless.baseline(FakeSession([FakeHost("x")]), ["x"])
    assert flagless.off == {"x": perfgate.OFF_BY_FLAG}
    # A rerun of an interrupted rollout compares with the baseline its marker kept.
    again = perfgate.PerfGate("r3", True, lambda line: None)
    again.resume("a", fig(40.0, 0.2, kind="baseline").to_json())
    script["a"] = []  # no new baseline is measured
    again.baseline(FakeSession([FakeHost("a")]), ["a"])
    assert again.baselines["a"].decode_tok_s == 40.0


def test_a_host_the_gate_failed_goes_back_to_the_previous_release(monkeypatch):
    """It runs the new release healthy, so rollback.py would keep it: the rollout asks for the
    previous one (previous_release), and only for those hosts; a host whose converge or health
    gate failed keeps rollback.py's own choice. No marker is written for an empty selection
    (an empty --limit would select the whole inventory)."""
    from servefleet.verbs import rollout as ro
    from servefleet.verbs.session import HostOutcome

    calls, sessions = [], []
    monkeypatch.setattr(ro.api, "converge", lambda inv, deploy, names, data: calls.append(
        (deploy, list(names), data["previous_release"])) or {
        n: HostOutcome(n, True) for n in names})
    monkeypatch.setattr(ro.Rollout, "session", lambda self, names=None: sessions.append(names))
    monkeypatch.setattr(ro.Rollout, "_gate", lambda self, names: {
        n: (n != "sick", "gate", 1.0) for n in names})
    marks = []
    monkeypatch.setattr(ro.Rollout, "_mark", lambda self, names, phase: marks.append(
        (list(names), phase)))
    r = ro.Rollout("inventory/testbed.py", "deploys/serve_q4_llamacpp.py", "1", 0, None,
                   {"x": 1}, lambda line: None)
    for n in ("slow", "broken"):
        r.report.hosts[n] = HostRollout(n)
    r._rollback(["slow", "broken"], slower=["slow"])
    assert calls == [(ro.ROLLBACK, ["broken"], False), (ro.ROLLBACK, ["slow"], True)]
    assert {n: h.result for n, h in r.report.hosts.items()} == {"slow": "rolled back",
                                                                 "broken": "rolled back"}
    assert marks == [(["slow", "broken"], "rolling-back"), (["slow", "broken"], None)]
    monkeypatch.undo()
    monkeypatch.setattr(ro.Rollout, "session", lambda self, names=None: sessions.append(names))
    ro.Rollout("inventory/testbed.py", "deploys/serve_q4_llamacpp.py", "1", 0, None, None,
               lambda line: None)._mark([], None)
    assert sessions == []
