"""What `servefleet report` reads from a node and shows: the last rollout's record
(state/last-rollout.json, core/rollout_record.py), parsed strictly like root's other records,
and every text a node supplies on the page, which stays text (no element, no attribute, no
terminal escape), whatever the node's root wrote."""

from __future__ import annotations

import json
import os
from dataclasses import replace

from servefleet.cli import report_html
from servefleet.core import records
from servefleet.core.perf import Figures
from servefleet.facts.releases import LastRolloutFact
from servefleet.verbs.report import NodeReport, ReleasePoint
from servefleet.verbs.status import NodeStatus
from tests.hostile.cases_node_records import node_lines, shell_read, unreadable
from tests.hostile.table import harmless, refused
from tests.unit.report_pages import HOSTILE, Elements, rollout_records, the_rollout

RECORDS, OUTPUT = "node records", "node output"


def record(**changes) -> str:
    doc = json.loads(rollout_records(the_rollout())["gpu-node-1"].dumps())
    return json.dumps({**doc, **changes})


def host(**changes) -> str:
    doc = json.loads(record())
    return json.dumps({**doc, "host": {**doc["host"], **changes}})


def fifo_record():
    def make(tmp: str) -> str:
        path = os.path.join(tmp, "last-rollout.json")
        os.mkfifo(path)
        return path

    got = LastRolloutFact().process(shell_read(make).split("\n"))
    return str(got) if isinstance(got, records.Unreadable) else None


def shown_as_text(page: str) -> None:
    parsed = Elements(page)
    assert not parsed.all("script") and not parsed.all("img"), "markup from a node"
    assert not any(k.startswith("on") or k in ("src", "href") for _, a in parsed.tags for k in a)
    assert "\x1b" not in page and "\u202e" not in page, "a control character reached the page"
    assert "<script>alert(1)</script>" in " ".join(parsed.text), "the text itself is lost"


def page_of(node: NodeReport) -> str:
    return report_html.page([node], "inventory/x.py", "now", "0")


def record_texts_are_text():
    """Every text field of a rollout record, read through the node's fact, on the page."""
    text = host(detail=HOSTILE, perf=HOSTILE, result=HOSTILE, to_release=HOSTILE)
    doc = {**json.loads(text), "message": HOSTILE}
    got = LastRolloutFact().process(node_lines(json.dumps(doc)))
    assert not isinstance(got, records.Unreadable) and got is not None, got
    shown_as_text(page_of(NodeReport(NodeStatus("gpu-node-1"), last_rollout=got)))


def release_names_in_charts_are_text():
    point = ReleasePoint(HOSTILE, HOSTILE, "a" * 12, HOSTILE, HOSTILE, None)
    fig = rollout_records(the_rollout())["gpu-node-1"].host["perf_after"]
    measured = replace(
        point, figures=Figures.from_json({**fig, "verdict": HOSTILE, "kind": HOSTILE})
    )
    page = page_of(NodeReport(NodeStatus("gpu-node-1", engine="x"), [measured, point]))
    assert Elements(page).all("svg", "chart"), "no chart drawn"
    shown_as_text(page)


def status_texts_are_text():
    status = NodeStatus(
        "gpu-node-1", role=HOSTILE, engine=HOSTILE, model=HOSTILE, service=HOSTILE,
        health=HOSTILE, release=HOSTILE, previous_release=HOSTILE, rolled_back_from=HOSTILE,
    )  # fmt: skip
    shown_as_text(page_of(NodeReport(status)))


def errors_are_text():
    node = NodeReport(
        NodeStatus("gpu-node-1", error=HOSTILE), history_error=HOSTILE, last_rollout_error=HOSTILE
    )
    shown_as_text(page_of(node))


def _cases():
    R, U = refused, unreadable
    bad = {
        "last-rollout.json nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        "a batch beyond the rollout's batches": (record(batch=9, batches=2), "'batch' is not"),
        "batch_hosts an object": (record(batch_hosts={"a": 1}), "'batch_hosts' is not a list"),
        "exit_code -1": (record(exit_code=-1), "'exit_code' is not a whole number"),
        "the host's result a list": (host(result=["upgraded"]), "'result' has the wrong type"),
        "a key servefleet never writes in the host's part": (
            host(unit_text="[Service]"),
            "unknown key 'unit_text'",
        ),
        "a detail of a megabyte": (host(detail="x" * 1_000_000), "'detail' is not a text of"),
        "a rollout id over two lines": (record(rollout_id="r\nforged"), "'rollout_id' is not"),
    }
    return (
        [R(RECORDS, name, said, U(LastRolloutFact, text)) for name, (text, said) in bad.items()]
        + [
            R(RECORDS, "last-rollout.json is a FIFO (cat would block)", "not a regular file",
              fifo_record),
            harmless(OUTPUT, "markup in a rollout record's texts", "shown as text on the page",
                     record_texts_are_text),
            harmless(OUTPUT, "markup in release names and verdicts (charts)",
                     "shown as text in the SVG", release_names_in_charts_are_text),
            harmless(OUTPUT, "markup in what status reads", "shown as text on the page",
                     status_texts_are_text),
            harmless(OUTPUT, "markup in a node's errors", "shown as text on the page",
                     errors_are_text),
        ]
    )  # fmt: skip


CASES = _cases()
