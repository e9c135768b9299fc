"""Input for `servefleet report`'s page in the tests, from real recorded state: the release
records of the real GPU node (tests/fixtures/h200/node/, a performance-gated rollout and a
rollback on an H200, with their real bench figures), completed with the fields that recording
left out and read back through the parsers the report uses (Releases.from_json,
LastRollout.loads), and the rollout's record as verbs/rollout_record.py writes it."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from servefleet.cli import report_html
from servefleet.core.releases import Releases
from servefleet.core.rollout_record import LastRollout
from servefleet.verbs.report import NodeReport, history
from servefleet.verbs.rollout_record import records
from servefleet.verbs.rollout_report import HostRollout, RolloutReport
from servefleet.verbs.status import NodeStatus

NODE = Path(__file__).resolve().parents[1] / "fixtures" / "h200" / "node"
ROLLOUT_ID = "20261206T044653-927bdd"  # tests/fixtures/h200/node/rollout.log's
# What a node's root could write into any text the page shows.
HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">\x1b[31m&amp;"\'\u202e'


def _release(summary: dict) -> dict:
    """A release of the node's recording, with what it left out (its unit differed in the
    context size only, as id_of_unit says)."""
    doc = {k: v for k, v in summary.items() if k != "id_of_unit"}
    context = summary["id_of_unit"][0]
    return {
        **doc,
        "unit": "servefleet-llama.service",
        "unit_text": f"[Service]\nExecStart={doc['prefix']}/bin/llama-server --ctx-size {context}\n",
        "model_repo": "servefleet-tests/tiny-qwen35moe-missing-mtp-GGUF",
        "model_revision": "main",
        "model_sha": doc["model_dir"].rsplit("/", 1)[-1],
        "data_digest": "d" * 16,
    }


def recorded(step: str) -> Releases:
    """The node's releases.json after a step of the recording (rollout, rollback, final)."""
    raw = json.loads((NODE / f"{step}.json").read_text())["releases"]
    doc = {
        "current": _release(raw["current"]) if raw["current"] else None,
        "previous": [_release(r) for r in raw["previous"]],
        "rolled_back_from": _release(raw["rolled_back_from"]) if raw["rolled_back_from"] else None,
    }
    return Releases.loads(json.dumps(doc))


def rollout_records(hosts: dict[str, HostRollout], batch: int = 1) -> dict[str, LastRollout]:
    """The records a rollout of these hosts (in batches of `batch`) leaves on them, as the
    nodes would give them back."""
    report = RolloutReport(ROLLOUT_ID, dict(hosts))
    names = list(hosts)
    groups = [names[i : i + batch] for i in range(0, len(names), batch)]
    written = records(report, groups, "2026-12-06T04:48:40Z")
    return {n: LastRollout.loads(r.dumps()) for n, r in written.items()}  # type: ignore[misc]


def gpu_host(name: str, step: str, last: LastRollout | None = None) -> NodeReport:
    rel = recorded(step)
    status = NodeStatus(
        name,
        role="llamacpp",
        engine=rel.current.short if rel.current else None,
        model=rel.current.model_repo if rel.current else None,
        service="active",
        enabled=True,
        health="200",
        port=8080,
        memory_used_gib=61.2,
        memory_total_gib=2015.5,
        release=rel.current.short if rel.current else None,
        previous_release=rel.previous_release.short if rel.previous_release else None,
    )
    return NodeReport(status, history(rel), rel.unreadable, last)


def the_rollout() -> dict[str, HostRollout]:
    """The real rollout of the recording (rollout.log) on gpu-node-1, beside a host that the
    same gate sent back (its figures the rollback step's) and one left untouched."""
    up = recorded("rollout")
    before, after = up.previous[0].perf, up.current.perf  # type: ignore[union-attr]
    verdict = after["verdict"]  # type: ignore[index]
    return {
        "gpu-node-1": HostRollout(
            "gpu-node-1",
            "llama.cpp b9785 (69ba37031141)",
            "llama.cpp b9785 (8f13783e3057)",
            "upgraded",
            35.0,
            30.2,
            None,
            "",
            4.4,
            verdict,
            before,
            after,
        ),
        "gpu-node-2": HostRollout(
            "gpu-node-2",
            "llama.cpp b9785 (69ba37031141)",
            "llama.cpp b9785 (8f13783e3057)",
            "rolled back",
            35.0,
            30.0,
            12.0,
            "performance gate failed: decode 165.1 -> 120.0 tok/s (-27.3 %, limit -10 %) FAILED",
            4.6,
            "performance gate failed: decode 165.1 -> 120.0 tok/s (-27.3 %, limit -10 %) FAILED",
            before,
            after,
        ),
        "gpu-node-3": HostRollout("gpu-node-3", "llama.cpp b9785 (69ba37031141)"),
    }


def fleet() -> list[NodeReport]:
    """A fleet of four: two GPU nodes with their release history and figures, one with no
    release yet, and one that could not be reached."""
    last = rollout_records(the_rollout())
    nodes = [
        gpu_host("gpu-node-1", "rollout", last["gpu-node-1"]),
        gpu_host("gpu-node-2", "rollback", last["gpu-node-2"]),
        NodeReport(
            NodeStatus(
                "gpu-node-3",
                role="llamacpp",
                engine="llama.cpp b9785",
                service="absent",
                health="down",
            ),
            last_rollout=last["gpu-node-3"],
        ),
        NodeReport(
            NodeStatus("gpu-node-4", role="llamacpp", error="connection refused", unreachable=True)
        ),
    ]
    return nodes


def page(nodes: list[NodeReport] | None = None) -> str:
    return report_html.page(
        fleet() if nodes is None else nodes, "inventory/gpu.py", "2026-12-06 05:00:00 UTC", "0.2.0"
    )


class Elements(HTMLParser):
    """Every element of a page: (tag, attributes), in order, and the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str, cls: str | None = None) -> list[dict]:
        return [
            a
            for t, a in self.tags
            if t == tag and (cls is None or cls in (a.get("class") or "").split())
        ]


def points(d: str) -> list[list[tuple[float, float]]]:
    """A path's segments (each M starts one), as points."""
    segments: list[list[tuple[float, float]]] = []
    for cmd, x, y in re.findall(r"([ML])([\d.]+),([\d.]+)", d):
        if cmd == "M":
            segments.append([])
        segments[-1].append((float(x), float(y)))
    return segments
