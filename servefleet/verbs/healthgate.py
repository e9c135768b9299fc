"""The health gate of a host: the health check its current release records, run now (a rollout
after each converge and rollback, `servefleet rollback` after going back)."""

from __future__ import annotations

import json
import shlex
import time

from servefleet.core.layout import NodeLayout
from servefleet.facts.releases import NodeReleases
from servefleet.operations import health
from servefleet.operations.node import run


def gate(host, **overrides) -> tuple[bool, str, float]:
    """Run the health check of the release the node records as current, now: (passed, what it
    said, seconds). Each release carries its own check, so a rolled-back host is gated as the
    release it serves, whatever the data says now."""
    records = host.get_fact(NodeReleases, path=NodeLayout.of(host.data).releases_file)
    if records.current is None or not records.current.gate:
        return False, "no release recorded on this host: converge it first", 0.0
    started = time.monotonic()
    argv = health.argv(**{**records.current.gate, **overrides})
    ok, out, err = run(host, " ".join(shlex.quote(a) for a in argv))
    seconds = time.monotonic() - started
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
    problems = report.get("problems") or [line for line in err.splitlines()
                                          if line.startswith("servefleet")][-1:]
    return False, "; ".join(problems) or "the health check failed", seconds


def release_of(host) -> str | None:
    records = host.get_fact(NodeReleases, path=NodeLayout.of(host.data).releases_file)
    return f"{records.current.short} ({records.current.id})" if records.current else None
