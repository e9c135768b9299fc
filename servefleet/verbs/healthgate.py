"""The health gate of a host: the health check its current release records, run now (a rollout
after each converge and rollback, `servefleet rollback` after going back)."""

from __future__ import annotations

import json
import shlex
import time

from servefleet.core.layout import NodeLayout
from servefleet.facts.releases import NodeReleases
from servefleet.fleet import registry
from servefleet.operations import health
from servefleet.operations.node import run
from servefleet.verbs import metrics


def gate(host, **overrides) -> tuple[bool, str, float]:
    """Run the health check of the release the node records as current, now: (passed, what it
    said, seconds). Each release carries its own check, so a rolled-back host is gated as the
    release it serves, whatever the data says now."""
    lay = NodeLayout.of(host.data)
    records = host.get_fact(NodeReleases, path=lay.releases_file)
    if records.unreadable:
        return False, f"{records.unreadable}; the health check was not run", 0.0
    if records.current is None or not records.current.gate:
        return False, "no release recorded on this host: converge it first", 0.0
    wrong = gate_problem(records.current.gate, lay, host.data)
    if wrong:
        return False, f"the current release's gate {wrong}; the health check was not run", 0.0
    engine = registry.engine_of_release(records.current.engine)
    if engine is None:
        return (
            False,
            f"the current release's engine {records.current.engine!r} is none of servefleet's",
            0.0,
        )
    generic, own = health.split_gate(records.current.gate)
    started = time.monotonic()
    argv = health.argv(**{**generic, **overrides}, extra=lambda: engine.health_args(own, True))
    ok, out, err = run(host, " ".join(shlex.quote(a) for a in argv))
    seconds = time.monotonic() - started
    metrics.refresh(host, health=ok)  # the textfile says it; the gate's verdict is the report
    report = {}
    for line in reversed(out.strip().splitlines()):
        try:
            report = json.loads(line)
            break
        except ValueError:
            continue
    if ok:
        kv = report.get("kv", "")
        return True, kv if kv.startswith("KV not compared") else "", seconds
    problems = (
        report.get("problems")
        or [line for line in err.splitlines() if line.startswith("servefleet")][-1:]
    )
    return False, "; ".join(problems) or "the health check failed", seconds


def gate_problem(gate: dict, lay: NodeLayout, data) -> str | None:
    """Root runs a recorded gate: only servefleet's health script with one of the data's
    interpreters (recipes/serving.py gate_args), never what a record names."""
    if gate.get("script") != lay.bin("servefleet-health"):
        return (
            f"names the script {str(gate.get('script'))[:80]!r}, not {lay.bin('servefleet-health')}"
        )
    table = data.get("python_interpreter") or {}
    allowed = set(table.values()) if isinstance(table, dict) else {table}
    if gate.get("python") not in allowed:
        return f"names the interpreter {str(gate.get('python'))[:80]!r}, not one of the data's"
    return None


def release_of(host) -> str | None:
    records = host.get_fact(NodeReleases, path=NodeLayout.of(host.data).releases_file)
    return f"{records.current.short} ({records.current.id})" if records.current else None
