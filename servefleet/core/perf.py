"""The performance gate's logic (servefleet rollout): bench figures, their comparison with a
baseline, and how they are kept in a release record.

Figures are the node-side bench's medians (files/bench/stream_bench.py): decode tok/s and time to
first token, with the workload that measured them and when. A release record on the node
(core.releases.Release.perf) keeps the last figures measured on that release.

The verdict: decode may fall by at most `decode_drop_pct` % of the baseline, TTFT rise by at
most `ttft_rise_pct` %. The gate's rule (verbs/perfgate.py) runs on top of compare(): a result
that does not pass clearly (a figure beyond its threshold, within `recheck_pct` points of it, or
not measured) is measured once more, and the host's speed is the best of the two measurements
(best()). Noise on a node is one-sided: a busy CPU, a cold cache or a just-restarted server only
ever make a request slower, never faster, so a release is slower only when even its best
measurement is. A figure that still cannot be measured makes the verdict inconclusive, never a
pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

PASS, FAIL, BORDERLINE, INCONCLUSIVE = "pass", "fail", "borderline", "inconclusive"
KEYS = (
    "perf_gate",
    "perf_gate_runs",
    "perf_gate_prompt_tokens",
    "perf_gate_max_tokens",
    "perf_gate_decode_drop_pct",
    "perf_gate_ttft_rise_pct",
    "perf_gate_recheck_pct",
)


@dataclass(frozen=True)
class Workload:
    runs: int
    prompt_tokens: int
    max_tokens: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Thresholds:
    decode_drop_pct: int | None = 10  # None: decode not checked
    ttft_rise_pct: int | None = 25  # None: TTFT not checked
    recheck_pct: int = 5


@dataclass(frozen=True)
class Settings:
    """A host's gate from its data; enabled False: the role's data switched it off."""

    enabled: bool
    workload: Workload
    thresholds: Thresholds

    @classmethod
    def of(cls, data) -> Settings:
        return cls(
            bool(data.get("perf_gate", True)),
            Workload(
                int(data.get("perf_gate_runs") or 3),
                int(data.get("perf_gate_prompt_tokens") or 512),
                int(data.get("perf_gate_max_tokens") or 64),
            ),
            Thresholds(
                data.get("perf_gate_decode_drop_pct"),
                data.get("perf_gate_ttft_rise_pct"),
                int(data.get("perf_gate_recheck_pct") or 0),
            ),
        )


@dataclass(frozen=True)
class Figures:
    decode_tok_s: float | None
    ttft_s: float
    measured_at: str = ""
    workload: dict = field(default_factory=dict)
    kind: str = ""  # baseline (before the upgrade) | gate (after it) | bench
    rollout: str = ""  # the rollout that measured them
    runs: tuple = ()  # per run: [decode tok/s, TTFT s]
    seconds: float = 0.0  # what measuring took, end to end
    verdict: str = ""  # for gate figures: what the comparison said
    # The medians without the time the engine waited for a CPU other work held (the bench's
    # PSI figures, stream_bench --cgroup); None where the node cannot tell.
    own_decode_tok_s: float | None = None
    own_ttft_s: float | None = None
    own_runs: tuple = ()  # per run: [decode tok/s, TTFT s] without the CPU waits

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["runs"] = [list(r) for r in self.runs]
        doc["own_runs"] = [list(r) for r in self.own_runs]
        if not self.own_runs:  # a node that cannot tell: the record as before
            for key in ("own_runs", "own_decode_tok_s", "own_ttft_s"):
                del doc[key]
        return doc

    @classmethod
    def from_json(cls, doc) -> Figures | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("ttft_s"), (int, float)):
            return None
        try:
            fig = cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})
        except TypeError:
            return None
        own = (fig.own_ttft_s, fig.own_decode_tok_s)
        if not all(v is None or measured(v) is not None for v in own):
            return None  # a record's own figures are numbers or absent, like the others
        return (
            fig
            if isinstance(fig.runs, (list, tuple)) and isinstance(fig.own_runs, (list, tuple))
            else None
        )

    @property
    def short(self) -> str:
        """ "41.2 tok/s, TTFT 0.120 s" (80 columns)."""
        decode = "-" if self.decode_tok_s is None else f"{self.decode_tok_s:.1f}"
        return f"{decode} tok/s, TTFT {self.ttft_s:.3f} s"

    @property
    def has_own(self) -> bool:
        """Both figures were also measured without the engine's CPU waits."""
        return measured(self.own_ttft_s) is not None and (
            self.decode_tok_s is None or measured(self.own_decode_tok_s) is not None
        )


def measured(value) -> float | None:
    """A figure as a number, or None where it was not measured: missing, not a number, NaN,
    infinite, zero or negative all mean that nothing was measured."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def figures(
    raw: dict, workload: Workload, when: str, kind: str, rollout: str, seconds: float
) -> Figures | str:
    """Figures from the bench's JSON line (median_decode_tok_s, median_ttft_s, runs), or why
    they cannot be figures (no time to first token was measured)."""
    ttft = measured(raw.get("median_ttft_s"))
    if ttft is None:
        return f"the bench measured no time to first token ({raw.get('median_ttft_s')!r:.40})"
    given = [r for r in raw.get("runs") or [] if isinstance(r, dict)]
    runs = tuple((measured(r.get("decode_tok_s")), measured(r.get("ttft_s"))) for r in given)
    own_runs = tuple(
        (measured(r.get("own_decode_tok_s")), measured(r.get("own_ttft_s"))) for r in given
    )
    return Figures(
        measured(raw.get("median_decode_tok_s")),
        ttft,
        when,
        workload.to_json(),
        kind,
        rollout,
        runs,
        round(seconds, 2),
        own_decode_tok_s=measured(raw.get("median_own_decode_tok_s")),
        own_ttft_s=measured(raw.get("median_own_ttft_s")),
        own_runs=own_runs if any(t for _, t in own_runs) else (),
    )


def best(first: Figures, second: Figures) -> Figures:
    """The faster of two measurements of one release, figure by figure (the higher decode, the
    lower TTFT): what the release can do when nothing else slows it down."""
    decodes = [d for d in (first.decode_tok_s, second.decode_tok_s) if d is not None]
    own = first.has_own and second.has_own  # a best of own figures only from both
    own_decodes = [d for d in (first.own_decode_tok_s, second.own_decode_tok_s) if d]
    return replace(
        second,
        decode_tok_s=max(decodes) if decodes else None,
        ttft_s=min(first.ttft_s, second.ttft_s),
        own_decode_tok_s=max(own_decodes) if own and own_decodes else None,
        own_ttft_s=min(first.own_ttft_s or 0, second.own_ttft_s or 0) if own else None,
        runs=tuple(first.runs) + tuple(second.runs),
        own_runs=tuple(first.own_runs) + tuple(second.own_runs) if own else (),
        seconds=round(first.seconds + second.seconds, 2),
    )


def change_pct(before: float | None, after: float | None) -> float | None:
    if not before or after is None:
        return None
    return (after - before) / before * 100


@dataclass(frozen=True)
class Verdict:
    state: str  # pass | fail | borderline | inconclusive
    failed: tuple[str, ...]  # "decode", "TTFT"
    lines: tuple[str, ...]  # one per figure compared, both values

    @property
    def text(self) -> str:
        return "; ".join(self.lines)


def compare(before: Figures, after: Figures, th: Thresholds) -> Verdict:
    """after against before. Decode falls (negative change) and TTFT rises (positive) count.
    A checked figure missing on either side makes it inconclusive (unless another failed)."""
    # Without the engine's CPU waits where both measurements have them (a busy node slows the
    # engine, not the release), else as measured.
    own = before.has_own and after.has_own
    checks = (
        (
            "decode",
            before.own_decode_tok_s if own else before.decode_tok_s,
            after.own_decode_tok_s if own else after.decode_tok_s,
            "tok/s",
            ".1f",
            None if th.decode_drop_pct is None else -th.decode_drop_pct,
        ),
        (
            "TTFT",
            before.own_ttft_s if own else before.ttft_s,
            after.own_ttft_s if own else after.ttft_s,
            "s",
            ".3f",
            th.ttft_rise_pct,
        ),
    )
    failed, lines, borderline, unmeasured = [], [], False, False
    for name, b, a, unit, fmt, limit in checks:
        if limit is None:
            continue
        change = change_pct(measured(b), measured(a))
        if change is None:
            lines.append(f"{name} not measured ({_v(b, fmt)} -> {_v(a, fmt)} {unit})")
            unmeasured = True
            continue
        worse = change < limit if limit < 0 else change > limit
        lines.append(
            f"{name} {_v(b, fmt)} -> {_v(a, fmt)} {unit} ({change:+.1f} %, limit "
            f"{limit:+d} %){' FAILED' if worse else ''}"
        )
        if worse:
            failed.append(name)
        if abs(change - limit) <= th.recheck_pct:
            borderline = True
    state = (
        FAIL
        if failed and not borderline
        else BORDERLINE
        if borderline
        else INCONCLUSIVE
        if unmeasured
        else PASS
    )
    if own and lines:  # say which figures were compared
        lines.append("CPU waits for other work removed")
    return Verdict(state, tuple(failed), tuple(lines))


def _v(value, fmt: str) -> str:
    return "-" if measured(value) is None else format(value, fmt)


def cv_pct(values) -> float | None:
    """Coefficient of variation (sample standard deviation / mean), in %."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return var**0.5 / mean * 100 if mean else None


def short(doc) -> str | None:
    """A release record's figures for a table cell ("41.2 tok/s, TTFT 0.120 s"), or None."""
    fig = Figures.from_json(doc)
    return fig.short if fig else None


def slowdown_pct(name: str, faster: float | None, slower: float | None) -> float | None:
    """How much slower `slower` is than `faster` in figure `name`, in % of the time a request
    takes (decode: tok/s, so the inverse ratio; TTFT: seconds); negative where it is faster."""
    fast, slow = measured(faster), measured(slower)
    if fast is None or slow is None:
        return None
    return (fast / slow - 1) * 100 if name == "decode" else (slow / fast - 1) * 100


def beyond_swing(name: str, before: Figures, now: Figures, after: Figures) -> bool:
    """The new release (`after`) is slower in figure `name` than the previous release measured
    before it and again after it (`before`, `now`) by more than that release's own swing
    between those two measurements: more than the node's own noise over the same window
    could make it."""
    own = before.has_own and now.has_own and after.has_own
    key = {"decode": "decode_tok_s", "TTFT": "ttft_s"}[name]
    key = f"own_{key}" if own else key
    prev = [getattr(before, key), getattr(now, key)]
    fast, slow = sorted(prev, reverse=name == "decode")  # the previous release's best, worst
    swing, regression = (
        slowdown_pct(name, fast, slow),
        slowdown_pct(name, slow, getattr(after, key)),
    )
    return swing is not None and regression is not None and regression > swing
