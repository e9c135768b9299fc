"""The performance gate's error rates on the testbed: false rollbacks of an equally fast release,
detections of a slower one, inconclusive verdicts, and what the gate costs a host, idle and
beside a background load.

    SERVEFLEET_TESTBED_INSTANCE=40 .venv/bin/python benchmarks/perf_gate.py \\
        [--trials 30] [--loads idle,compile] [--releases same,ttft] [--traces FILE]
    .venv/bin/python benchmarks/perf_gate.py --judge FILE      # the rule again, on saved traces
    ... perf_gate.py --ab b9785-patch1 --trials 6 [--loads ...]  # the node's own noise: A vs B
    python3 benchmarks/perf_gate.py --node INVENTORY HOST ...  # a node serving the llama recipe

One rtx4090 host (the real llama-server b9785, CPU build, the tiny GGUF, the recipe's unit)
serves release A. A trial is what a rollout does to a host: the gate's baseline measurement of
A, a switch to release B (the unit of B, a restart, the real health gate: /health, a chat, the
settle period), the gate's measurements of B, a switch back to A (the rollback) and the
measurements of A again (the bracket), a switch to B again and its measurements once more
(the rule's last stage, verbs/rollout_again.py), and a switch back to A. Every measurement is
the rollout's own (verbs.perfgate.measure: the node-side bench, the host's gate workload from
its data), and every trial takes all of them whatever the verdict, so a trace holds what any
rule could ask for. The verdict is then the rollout's rule (verbs.perfgate.judge) on the trace, taking measurements in
the order the rollout would, only as many as it would: with the load independent of the
verdict, that is the verdict the rollout would have reached.

Releases B: `same` is A restarted (an equally fast release: every rollback is false); `ttft`
(`--ubatch-size 1`) has about 130 % higher TTFT and must be rolled back (measured with this
benchmark's --calibrate). No llama-server argument was found that makes the tiny model decode
30 % slower on the testbed (it already runs `--threads 1`), so there is no decode release.
Loads: `idle` (nothing else of ours runs: a test session on the machine still does), `compile`
(one llama.cpp compile at normal priority, servefleet_dev.testing.load, through every
measurement of the condition).

The table counts each condition's verdicts; beside them, how many trials two other rules would
have rolled back on the same traces: `A B A alone` (without the last stage) and `last vs A1` (the
last stage judged against the first baseline instead of the previous release measured again).

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=40 unless set); brought down at the
end unless --keep. With --node, it measures that host of that inventory instead, as it serves
the llama.cpp recipe (the GPU node on the lent H200: tests/device/gpunode.sh's `gate` step),
with that host's data: its workload and thresholds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "40")

from servefleet.cli.args import parse_data  # noqa: E402
from servefleet.core import perf  # noqa: E402
from servefleet.core.groupdata import load_group  # noqa: E402
from servefleet.operations.node import run  # noqa: E402
from servefleet.verbs import perfgate, session as api  # noqa: E402
from servefleet.verbs.healthgate import gate  # noqa: E402

INVENTORY, Q4, HOST = "inventory/testbed.py", "deploys/serve_q4_llamacpp.py", "rtx4090-1"
UNIT = "/etc/systemd/system/servefleet-llama.service"
# Release B's llama-server arguments after the testbed's --threads 1 (--calibrate measures the
# change the gate sees: A and B alternately, medians).
RELEASES = {
    "same": [],
    # The prompt evaluated one token per batch: +83 % TTFT without CPU waits in the e2e test's
    # run beside a compile; +120 % measured outside a guest (same build and model, -c 65536).
    "ttft": ["--ubatch-size", "1"],
}
SHOULD_FAIL = {"same": False, "ttft": True}


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the node ---------------------------------------------------------------------------------


def unit_with(unit: str, extra: list[str]) -> str:
    """The recipe's unit with `extra` right after the binary on its one ExecStart= line (the
    line goes on with a backslash: the arguments continue on the next lines)."""
    if not extra:
        return unit
    lines = unit.split("\n")
    at = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    if len(at) != 1:
        raise SystemExit(f"the unit has {len(at)} ExecStart= lines: {unit}")
    binary, _, rest = lines[at[0]].partition(" ")
    lines[at[0]] = f"{binary} {shlex.join(extra)} {rest}"
    return "\n".join(lines)


def switch(host, unit_text: str) -> float:
    """Serve unit_text: written, reloaded, restarted, then the rollout's health gate."""
    started = time.monotonic()
    # The unit as read back has no final newline: without one the here-document's end marker
    # would not start a line, and the rest of the script would become part of the unit.
    body = unit_text.rstrip("\n") + "\n"
    script = (
        f"cat > {UNIT}.new <<'SERVEFLEET_EOF'\n{body}SERVEFLEET_EOF\n"
        f"mv -f {UNIT}.new {UNIT} && systemctl daemon-reload && "
        f"systemctl restart servefleet-llama.service"
    )
    ok, _, err = run(host, f"sh -c {shlex.quote(script)}")
    if not ok:
        raise SystemExit(f"switch failed: {err[-500:]}")
    if run(host, f"cat {UNIT}")[1].rstrip("\n") != unit_text.rstrip("\n"):
        raise SystemExit("switch failed: the unit on the node is not the one written")
    ok, said, _ = gate(host)
    if not ok:
        raise SystemExit(f"health gate failed after the switch: {said}")
    return time.monotonic() - started


def measure(host) -> dict | str:
    fig = perfgate.measure(host, "trace", "perf-gate-benchmark", perfgate.serving_unit(host))
    return fig.to_json() if isinstance(fig, perf.Figures) else fig


@contextlib.contextmanager
def the_node(inventory: str = INVENTORY, name: str = HOST, data: dict | None = None):
    """(the host, a call of func(host) in its context, release A's unit) for one session."""
    with api.session(inventory, [name], data) as sess:
        host = sess.targets[0]

        def on_host(func):
            res = sess.each(func, [host])[name]
            if isinstance(res, Exception):
                raise res
            return res

        yield host, on_host, on_host(lambda h: run(h, f"cat {UNIT}")[1])


# --- the trials -----------------------------------------------------------------------------------


def trial(host, unit_a: str, unit_b: str) -> dict:
    """Everything a rollout of host from A to B could measure, in its order."""
    t: dict = {"load": os.getloadavg()[0], "before": measure(host)}
    t["switch_s"] = switch(host, unit_b)
    t["after"] = [measure(host), measure(host)]
    t["rollback_s"] = switch(host, unit_a)
    t["again"] = [measure(host), measure(host)]
    t["forward_s"] = switch(host, unit_b)  # served again (verbs/rollout_again.py)
    t["once_more"] = [measure(host), measure(host)]
    t["back_s"] = switch(host, unit_a)  # A for the next trial, as a final rollback would
    return t


def background(load: str):
    """The load beside a condition's measurements: `compile` or none (`idle`)."""
    if load != "compile":
        return contextlib.nullcontext()
    # Imported here: a --node run (the GPU node's launching chroot) has only the operator's
    # packages, not the testbed's.
    from servefleet_dev.testing.load import compile_load

    return compile_load()


def collect(args) -> dict:
    traces: dict = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "cores": os.cpu_count(),
            "releases": {r: RELEASES[r] for r in args.releases},
        },
        "conditions": {},
    }
    data = parse_data(args.data)  # as servefleet's --data reads them
    with the_node(*(args.node or (INVENTORY, HOST)), data or None) as (host, on_host, unit_a):
        settings = perf.Settings.of(host.data.dict())
        traces["meta"]["node"] = host.name
        traces["meta"]["workload"] = settings.workload.to_json()
        traces["meta"]["thresholds"] = asdict(settings.thresholds)
        for load in args.loads:
            with background(load):
                # The releases take turns, trial by trial: a run cut short (a lent machine's
                # time) still has trials of each, and a drift of the node's speed over the run
                # falls on both alike.
                for i in range(args.trials):
                    for rel in args.releases:
                        unit_b = unit_with(unit_a, RELEASES[rel])
                        got = traces["conditions"].setdefault(f"{load}/{rel}", [])
                        got.append(on_host(lambda h, b=unit_b: trial(h, unit_a, b)))
                        say(f"{load} {rel} {i + 1}/{args.trials}: {brief(got[-1])}")
                        if args.traces:  # after every trial: an interrupted run keeps its traces
                            Path(args.traces).write_text(json.dumps(traces))
    return traces


def brief(t: dict) -> str:
    def f(m):
        return m if isinstance(m, str) else perf.Figures.from_json(m).short

    return f"{f(t['before'])} -> {f(t['after'][0])} | {f(t['after'][1])} ; again {f(t['again'][0])}"


# --- the rule on the traces ---------------------------------------------------------------------


def verdict(
    t: dict, th: perf.Thresholds, once_more: bool = True, last_against_first: bool = False
) -> tuple[str, float]:
    """The rollout's verdict on one trace (verbs.perfgate.judge), and what the gate cost the
    host; once_more=False: the rule without its last stage (A B A: the bracket's verdict
    stands); last_against_first: the last stage against the first baseline, not against the
    previous release measured again (the rule of stop 38; the cost is not counted then)."""
    kinds = ("after", "again", "once_more")
    steps = {k: iter(t.get(k, ())) for k in kinds}
    # The switch before each stage: the rollback, then serving the new release again.
    switch_s = {"again": t["rollback_s"], "once_more": t.get("forward_s", 0.0)}
    took = {"s": 0.0, "stages": set()}

    def take(kind: str):
        m = next(steps[kind])
        fig = perf.Figures.from_json(m) if isinstance(m, dict) else m
        if isinstance(fig, perf.Figures):
            took["s"] += fig.seconds
        if kind in switch_s and kind not in took["stages"]:
            took["stages"].add(kind)
            took["s"] += switch_s[kind]
        return fig

    before = perf.Figures.from_json(t["before"])
    took["s"] += before.seconds if before else 0
    last = (lambda: take("once_more")) if once_more and "once_more" in t else None
    state, said = perfgate.judge(
        before, th, lambda: take("after"), lambda: take("again"), measure_new_again=last
    )
    if last_against_first and perfgate.ONCE_MORE in said:  # the last stage ran: judged again
        steps["once_more"] = iter(t["once_more"])
        state = perfgate.decide(before, th, lambda: take("once_more"), lambda line: None)[0]
    if state == perf.FAIL and "once_more" in took["stages"]:
        took["s"] += t["back_s"]  # rolled back once more
    return state, took["s"]


def judge(traces: dict, th: perf.Thresholds) -> list[dict]:
    """The rollout's verdicts on each condition's trials, and what they cost."""
    rows = []
    for cond, trials in traces["conditions"].items():
        load, rel = cond.split("/")
        counts = {perf.PASS: 0, perf.FAIL: 0, perf.INCONCLUSIVE: 0}
        costs, aba, first = [], 0, 0
        for t in trials:
            state, cost = verdict(t, th)
            counts[state] += 1
            costs.append(cost)
            aba += verdict(t, th, once_more=False)[0] == perf.FAIL
            first += verdict(t, th, last_against_first=True)[0] == perf.FAIL
        wrong = counts[perf.FAIL] if not SHOULD_FAIL[rel] else counts[perf.PASS]
        rows.append(
            {
                "load": load,
                "release": rel,
                "trials": len(trials),
                **counts,
                "aba": aba,
                "first": first,
                "wrong": wrong,
                "cost_s": statistics.median(costs) if costs else None,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    head = (
        f"{'load':8} {'release B':10} {'trials':>6} {'passed':>6} {'rolled back':>11} "
        f"{'inconcl.':>8}  {'wrong':>5}  {'A B A alone':>11}  {'last vs A1':>10}  "
        f"gate cost/host (median)"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        what = "false rollbacks" if not SHOULD_FAIL[r["release"]] else "missed"
        lines.append(
            f"{r['load']:8} {r['release']:10} {r['trials']:>6} {r[perf.PASS]:>6} "
            f"{r[perf.FAIL]:>11} {r[perf.INCONCLUSIVE]:>8}  {r['wrong']:>5}  {r['aba']:>11}  "
            f"{r['first']:>10}  "
            f"{r['cost_s']:.1f} s   ({what}: {r['wrong']})"
        )
    return "\n".join(lines)


def alternate(
    on_host, units: dict, trials: int, each: int, shown, prefix: str = ""
) -> dict[str, list]:
    """Each unit of `units` (key -> unit text) served in turn, `trials` times, with `each`
    measurements after every switch: {key: [Figures, ...]}; each measurement said as shown()."""
    got: dict[str, list] = {key: [] for key in units}
    for i in range(trials):
        for key, unit in units.items():
            on_host(lambda h, u=unit: switch(h, u))
            for _ in range(each):
                fig = perf.Figures.from_json(on_host(measure))
                got[key].append(fig)
                say(f"{prefix}{' ' if prefix else ''}{key} {i + 1}/{trials}: {shown(fig)}")
    return got


def calibrate(args) -> None:
    """A against A + args.calibrate, alternately, --trials times each: the change the gate sees."""
    extra = json.loads(args.calibrate)
    with the_node() as (host, on_host, unit_a):
        unit_b = unit_with(unit_a, extra)
        got = alternate(on_host, {"b": unit_b, "a": unit_a}, args.trials, 1, lambda f: f.short)
    own = all(f.has_own for f in got["a"] + got["b"])  # compared as the gate compares them

    def med(key: str, figure: str) -> float:
        name = f"own_{figure}" if own else figure
        return statistics.median(getattr(f, name) for f in got[key])

    da, db = med("a", "decode_tok_s"), med("b", "decode_tok_s")
    ta, tb = med("a", "ttft_s"), med("b", "ttft_s")
    print(
        f"{extra}{' (without CPU waits)' if own else ''}: decode {da:.1f} -> {db:.1f} tok/s ({perf.change_pct(da, db):+.1f} %), "
        f"TTFT {ta:.3f} -> {tb:.3f} s ({perf.change_pct(ta, tb):+.1f} %)"
    )


def ab(args) -> None:
    """Release A (the testbed's pin) against the build of tag args.ab (rolled out without a
    gate, then served by switching units, as calibrate): alternately, --trials pairs of two
    measurements each, under each of --loads. The node's own noise, in the figures the gate
    compares: what any threshold on this node has to stay outside."""
    import subprocess

    from servefleet_dev.testing.llama_src import commits

    with the_node() as (_, _, unit_a):
        pass
    cli = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
    tag = [f"llamacpp_tag={args.ab}", f"llamacpp_commit={commits()[args.ab]}", "releases_keep=3"]
    data = [a for kv in tag for a in ("--data", kv)]
    r = subprocess.run(
        [*cli, "rollout", INVENTORY, Q4, "--no-perf-gate", "--limit", HOST, *data],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"the rollout to {args.ab} failed: {r.stdout[-800:]}{r.stderr[-800:]}")
    with the_node() as (_, on_host, unit_b):
        for load in args.loads:
            with background(load):
                got = alternate(on_host, {"a": unit_a, "b": unit_b}, args.trials, 2, own, load)
            for key, figs in got.items():
                name = "A (pin)" if key == "a" else f"B ({args.ab})"
                d = [f.own_decode_tok_s or f.decode_tok_s for f in figs]
                t = [f.own_ttft_s or f.ttft_s for f in figs]
                print(
                    f"{load:8} {name:22} decode median {statistics.median(d):6.0f} tok/s "
                    f"(min {min(d):.0f}, max {max(d):.0f}); TTFT median "
                    f"{statistics.median(t):.3f} s (min {min(t):.3f}, max {max(t):.3f})"
                )


def own(fig: perf.Figures) -> str:
    if not fig.has_own:
        return fig.short
    return f"own {fig.own_decode_tok_s:.0f} tok/s, TTFT {fig.own_ttft_s:.3f} s ({fig.short})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--loads", default="idle,compile")
    ap.add_argument("--releases", default="same,ttft")
    ap.add_argument("--traces", help="write the traces to this JSON file")
    ap.add_argument("--judge", help="judge the traces in this file (no testbed)")
    ap.add_argument(
        "--node",
        nargs=2,
        metavar=("INVENTORY", "HOST"),
        help="measure this host, serving the llama.cpp recipe (no testbed)",
    )
    ap.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="host data for the benchmark's session (e.g. health_settle_s=5: the switches' "
        "health gate waits less; the gate's figures are measured as before)",
    )
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--calibrate", metavar="JSON", help="measure A against A + these arguments")
    ap.add_argument("--ab", metavar="TAG", help="measure A against the build of this tag")
    args = ap.parse_args()
    args.loads, args.releases = args.loads.split(","), args.releases.split(",")
    if args.judge:
        traces = json.loads(Path(args.judge).read_text())
    elif args.node:
        traces = collect(args)
    else:
        from servefleet_dev.testbed import lifecycle, material
        from servefleet_dev.testing.pyinfra_cli import pyinfra

        quiet = lambda m: None  # noqa: E731
        try:
            lifecycle.up([HOST], log=quiet)
            material.prepare(spark=False, log=quiet)
            out = pyinfra(INVENTORY, Q4, limit=HOST, timeout=3600)
            if out.returncode != 0:
                raise SystemExit(out.output[-3000:])
            if args.calibrate:
                calibrate(args)
                return 0
            if args.ab:
                ab(args)
                return 0
            traces = collect(args)
        finally:
            if not args.keep:
                lifecycle.down(log=quiet)
    if "thresholds" in traces["meta"]:  # the measured host's own
        th = perf.Thresholds(**traces["meta"]["thresholds"])
    else:  # traces from before they were kept: the testbed's
        data = {}
        for group in ("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed"):
            data.update(load_group(group))
        th = perf.Settings.of(data).thresholds
    print(
        f"{traces['meta'].get('node', HOST)}, {traces['meta']['date']}, "
        f"{traces['meta']['cores']} cores, workload "
        f"{traces['meta'].get('workload')}, thresholds decode -{th.decode_drop_pct} %, "
        f"TTFT +{th.ttft_rise_pct} %"
    )
    print(table(judge(traces, th)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
