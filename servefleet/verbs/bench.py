"""Per-node serving benchmark (`servefleet bench`): the field method, run on each node against
its own API (files/bench/stream_bench.py, which reads the engine through bin/engine_client.py,
uploaded beside it), with the node's API key file when it has one, within BENCH_TIMEOUT_S.

`--compare`: each node measured now against the figures its previous release recorded (a
performance-gated rollout keeps them in the release records, core.releases.Release.perf), by
default with the gate's workload from the node's data, so that both come from the same one."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from servefleet.core import perf
from servefleet.core.layout import NodeLayout, api_url
from servefleet.facts.releases import NodeReleases
from servefleet.fleet import registry
from servefleet.operations.files import put
from servefleet.operations.node import run
from servefleet.recipes.base import python
from servefleet.recipes.serving import ENGINE_CLIENT, ENGINE_CLIENT_NAME
from servefleet.verbs import session as api

SCRIPT = Path("files") / "bench" / "stream_bench.py"
BENCH_TIMEOUT_S = 900  # the node-side bench's deadline: every request of one measurement
RESULT_BYTES = 1 << 20  # the bench's JSON line, at most


@dataclass
class NodeResult:
    host: str
    ok: bool
    error: str | None = None
    prompt_tokens: int | None = None
    median_ttft_s: float | None = None
    median_decode_tok_s: float | None = None
    roofline_tok_s: float | None = None  # memory bandwidth / bytes read per token
    roofline_ratio: float | None = None
    runs: list | None = None
    unreachable: bool = False  # not connected: error says why (exit 3, not 1)
    # The same medians without the engine's CPU waits (stream_bench --cgroup, PSI); None where
    # the node cannot tell.
    median_own_ttft_s: float | None = None
    median_own_decode_tok_s: float | None = None
    skipped: str | None = None  # why this host was not benched (no serving engine): no failure
    roofline_note: str | None = None  # why no roofline figure means anything here (testbed)


def not_serving(host) -> str | None:
    """Why a host has no serving engine to bench (a class without one: the depot), or None."""
    groups = list(getattr(host, "groups", ()) or ())
    cls = registry.node_class_of(groups)
    if cls is not None and registry.engine_of(groups) is None:
        return f"no serving engine (role {cls.name}): nothing to bench"
    return None


def no_roofline(host, data) -> str | None:
    """Why the data's roofline means nothing on this host, or None: a testbed host (the group
    `testbed`, or the vLLM stand-in as its engine) is none of the node classes whose roofline the
    data holds (a CPU serves it)."""
    if data.get("vllm_executable"):
        return "testbed: the engine stand-in (vllm_executable), not the engine on the hardware the roofline is for"
    if "testbed" in set(getattr(host, "groups", ()) or ()):
        return "testbed: served on the CPU, not on the hardware the roofline is for"
    return None


def roofline(bandwidth_bytes_per_s, bytes_per_token) -> float | None:
    """Decode can't beat reading the active weights once per token: bandwidth / bytes."""
    if bandwidth_bytes_per_s and bytes_per_token:
        return bandwidth_bytes_per_s / bytes_per_token
    return None


def bench_host(
    host, runs: int, prompt_tokens: int, max_tokens: int, unit: str | None = None
) -> NodeResult:
    data = host.data.dict()
    lay = NodeLayout.of(data)
    script = lay.bin("servefleet-stream-bench")
    if not put(
        host.state, host, lay.bin(ENGINE_CLIENT_NAME), Path(ENGINE_CLIENT).read_bytes()
    ) or not put(host.state, host, script, SCRIPT.read_bytes(), mode="755"):
        return NodeResult(host.name, False, "could not upload the bench script")
    args = [
        python(),
        "-I",
        script,
        "--url",
        api_url(data),
        "--runs",
        str(runs),
        "--prompt-tokens",
        str(prompt_tokens),
        "--max-tokens",
        str(max_tokens),
        "--timeout",
        str(BENCH_TIMEOUT_S),
    ]
    if data.get("served_model_name"):
        args += ["--model", data["served_model_name"]]
    # The key the node serves with, read there (the operator may not hold the key file).
    args += ["--api-key-file", lay.api_key_file]
    if unit:  # the serving unit's CPU waits (PSI) are measured too
        args += ["--cgroup", lay.unit_cgroup(unit)]
    ok, out, err = run(host, " ".join(shlex.quote(a) for a in args))
    return read_result(host.name, data, ok, out, err, no_roofline(host, data))


def read_result(
    name: str, data, ok: bool, out: str, err: str, no_roofline: str | None = None
) -> NodeResult:
    """What the node-side bench's run says: its figures when both were measured, else why not
    (its last line on stderr: one line for an answer the engine reader refused)."""
    if not ok:
        lines = (err or out).strip().splitlines()
        return NodeResult(name, False, lines[-1][:300] if lines else "the bench failed")
    raw = result_line(out)
    if isinstance(raw, str):
        return NodeResult(name, False, raw)
    top = (
        None
        if no_roofline
        else roofline(data.get("memory_bandwidth_bytes_per_s"), data.get("bytes_per_token"))
    )
    decode = perf.measured(raw.get("median_decode_tok_s"))
    ttft = perf.measured(raw.get("median_ttft_s"))
    why = unmeasured(raw, decode, ttft)
    if why:  # never a figure that passes: the gate measures again, then is inconclusive
        return NodeResult(name, False, f"not measured: {why}", runs=raw["runs"])
    if decode is None:  # unmeasured() named it: a missing figure is never measured
        raise ValueError(f"{name}: the bench's decode figure passed as measured without one")
    prompt = raw.get("prompt_tokens")
    return NodeResult(
        name,
        True,
        None,
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None,
        ttft,
        decode,
        top,
        decode / top if top else None,
        raw["runs"],
        median_own_ttft_s=perf.measured(raw.get("median_own_ttft_s")),
        median_own_decode_tok_s=perf.measured(raw.get("median_own_decode_tok_s")),
        roofline_note=no_roofline,
    )


def unmeasured(raw: dict, decode, ttft) -> str | None:
    """Why the bench's figures are not both measured (what the bench said, or the figure that
    is missing, NaN, infinite or not positive), or None."""
    said = raw.get("unmeasured")
    if isinstance(said, list) and said:
        return "; ".join(str(s)[:120] for s in said[:4])
    missing = [name for name, value in (("decode tok/s", decode), ("TTFT", ttft)) if value is None]
    return f"the bench gave no {' and no '.join(missing)}" if missing else None


def result_line(out: str) -> dict | str:
    """The bench's JSON line (its last line of output) as a dict whose runs are a list of
    objects, or why it is not one. NaN and Infinity are not JSON here: a figure the bench could
    not measure is null, and perf.measured() reads anything else that is not a positive finite
    number as not measured."""
    lines = out.strip().splitlines()
    line = lines[-1] if lines else ""
    if len(line) > RESULT_BYTES:
        return f"the bench printed a result line of {len(line)} bytes"

    def constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        raw = json.loads(line, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        return f"the bench printed no JSON result ({str(exc)[:80]})"
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("runs"), list)
        or not all(isinstance(r, dict) for r in raw["runs"])
    ):
        return "the bench's result has no list of runs"
    return raw


def bench(inventory: str, limit=None, runs=5, prompt_tokens=2048, max_tokens=256):
    """Bench every selected host that serves; a depot is skipped (reached or not), and says so."""
    with api.session(inventory, limit) as sess:
        skip = {h.name: why for h in sess.targets if (why := not_serving(h))}
        serving = [h for h in sess.targets if h.name not in skip]
        results = sess.each(lambda h: bench_host(h, runs, prompt_tokens, max_tokens), serving)
        out = [NodeResult(n, False, skipped=why) for n, why in skip.items()]
        out += [
            NodeResult(n, False, why, unreachable=True)
            for n, why in sess.unreachable.items()
            if n not in skip
        ]
        for name, res in results.items():
            out.append(
                res
                if isinstance(res, NodeResult)
                else NodeResult(name, False, f"{type(res).__name__}: {res}")
            )
    return sorted(out, key=lambda r: r.host)


@dataclass
class Comparison:
    host: str
    ok: bool
    error: str | None = None
    release: str | None = None  # the current release, short
    now: dict | None = None  # measured now (core.perf.Figures as JSON)
    previous_release: str | None = None
    previous: dict | None = None  # what the previous release recorded, or None
    lines: list = field(default_factory=list)  # now against previous: both values, the change
    slower: bool = False  # beyond the data's gate thresholds against the previous release
    unreachable: bool = False  # not connected: error says why (exit 3, not 1)
    skipped: str | None = None  # why this host was not benched (no serving engine): no failure


def compare_host(host, runs=None, prompt_tokens=None, max_tokens=None) -> Comparison:
    settings = perf.Settings.of(host.data.dict())
    w = settings.workload
    w = perf.Workload(runs or w.runs, prompt_tokens or w.prompt_tokens, max_tokens or w.max_tokens)
    records = host.get_fact(NodeReleases, path=NodeLayout.of(host.data).releases_file)
    prev = records.previous_release
    out = Comparison(
        host.name,
        False,
        release=records.current.short if records.current else None,
        previous_release=prev.short if prev else None,
        previous=prev.perf if prev else None,
    )
    started = time.monotonic()
    unit = records.current.unit if records.current else None
    res = bench_host(host, w.runs, w.prompt_tokens, w.max_tokens, unit)
    if not res.ok:
        out.error = res.error
        return out
    raw = {
        "median_decode_tok_s": res.median_decode_tok_s,
        "median_ttft_s": res.median_ttft_s,
        "median_own_decode_tok_s": res.median_own_decode_tok_s,
        "median_own_ttft_s": res.median_own_ttft_s,
        "runs": res.runs,
    }
    now = perf.figures(
        raw,
        w,
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bench",
        "",
        time.monotonic() - started,
    )
    if isinstance(now, str):
        out.error = now
        return out
    out.ok, out.now = True, now.to_json()
    then = perf.Figures.from_json(out.previous)
    if then is None:
        out.lines = [
            "no figures recorded for the previous release" if prev else "no previous release"
        ]
        return out
    verdict = perf.compare(then, now, settings.thresholds)
    out.lines, out.slower = list(verdict.lines), bool(verdict.failed)
    if then.workload and then.workload != w.to_json():
        out.lines.append(f"workload differs: then {then.workload}, now {w.to_json()}")
    return out


def compare(inventory: str, limit=None, runs=None, prompt_tokens=None, max_tokens=None):
    with api.session(inventory, limit) as sess:
        skip = {h.name: why for h in sess.targets if (why := not_serving(h))}
        serving = [h for h in sess.targets if h.name not in skip]
        results = sess.each(lambda h: compare_host(h, runs, prompt_tokens, max_tokens), serving)
        out = [Comparison(n, False, skipped=why) for n, why in skip.items()]
        out += [
            Comparison(n, False, why, unreachable=True)
            for n, why in sess.unreachable.items()
            if n not in skip
        ]
        for name, res in results.items():
            out.append(
                res
                if isinstance(res, Comparison)
                else Comparison(name, False, f"{type(res).__name__}: {res}")
            )
    return sorted(out, key=lambda r: r.host)
