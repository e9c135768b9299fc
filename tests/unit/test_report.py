"""`servefleet report`'s page (#30): the status, the last rollout batch by batch, each node's
release history with a decode and a TTFT chart (one point per release measured); everything a
node supplies escaped; nothing fetched. Rendered from the real GPU node's recorded release
records (tests/unit/report_pages.py); what Chromium makes of it: test_report_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import pytest

from servefleet.cli import report as cli_report
from servefleet.cli.report_svg import COLOURS, line_chart, nice_top
from servefleet.core.records import RecordError
from servefleet.core.releases import Releases
from servefleet.core.rollout_record import LastRollout, RolloutView
from servefleet.verbs import rollout_record
from servefleet.verbs.report import CURRENT, PREVIOUS, ROLLED_BACK_FROM, NodeReport, history
from servefleet.verbs.rollout_report import HostRollout, RolloutReport
from servefleet.verbs.status import NodeStatus
from tests.unit import report_pages as rp
from tests.unit.report_pages import HOSTILE, Elements, points

REPO = Path(__file__).resolve().parents[2]


# --- the page ------------------------------------------------------------------------------


def test_each_node_with_figures_gets_a_decode_and_a_ttft_chart_with_a_point_per_release():
    page = Elements(rp.page())
    charts = page.all("svg", "chart")
    # gpu-node-1 (after the rollout) and gpu-node-2 (after the rollback) have two measured
    # releases each; gpu-node-3 has none, gpu-node-4 was not read.
    assert [a["class"] for a in charts] == ["chart decode", "chart ttft"] * 2
    paths = page.all("path", "series")
    assert [len(points(p["d"])) for p in paths] == [1] * 4  # one unbroken line each
    assert [len(points(p["d"])[0]) for p in paths] == [2] * 4
    assert [p["stroke"] for p in paths] == [COLOURS["decode"], COLOURS["ttft"]] * 2
    assert len(page.all("circle", "point")) == 8
    text = " ".join(page.text)
    # The real figures: the baseline 165.1 tok/s on b9785 (89cd83), the gate's 159.6 after.
    assert "165.1" in text and "159.6" in text and "0.033" in text and "0.032" in text
    assert "gpu-node-3" in text and "no release recorded." in text
    assert "not read: connection refused" in text


def test_the_chart_puts_higher_figures_higher_and_breaks_the_line_at_a_release_not_measured():
    svg = Elements(
        line_chart(
            "decode",
            "decode",
            "tok/s",
            [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")],
            [100.0, None, 50.0, 75.0],
        )
    )
    (path,) = svg.all("path", "series")
    first, second = points(path["d"])
    assert len(first) == 1 and len(second) == 2  # a, then c-d: no line across b
    (ax, ay), (cx, cy), (dx, dy) = first[0], *second
    assert ax < cx < dx and ay < dy < cy  # SVG's y grows downwards
    assert [c["data-release"] for c in svg.all("circle", "point")] == ["0", "2", "3"]
    assert "not measured" in " ".join(svg.text)


def test_the_axis_ends_on_a_round_number_above_the_highest_figure():
    assert nice_top(165.1) == (200, 4)
    assert nice_top(0.0331) == (0.05, 5)
    assert nice_top(4.4) == (5, 5)
    assert nice_top(0) == (1, 4)


def test_releases_without_figures_are_listed_without_a_chart():
    rel = rp.recorded("rollout")
    bare = Releases(
        replace(rel.current, perf=None), tuple(replace(r, perf=None) for r in rel.previous)
    )
    node = NodeReport(
        NodeStatus("gpu-node-1", role="llamacpp", engine="llama.cpp b9785"), history(bare)
    )
    page = Elements(rp.page([node]))
    assert page.all("svg") == [] and page.all("path") == []
    text = " ".join(page.text)
    assert "No bench figures recorded on these releases yet." in text
    assert "89cd83e69ffe" in text and "4910b1c7c77e" in text  # both releases still listed


def test_an_empty_fleet_history_and_no_rollout_render_as_such():
    node = NodeReport(
        NodeStatus(
            "gpu-node-1", role="llamacpp", engine="llama.cpp b9785", service="absent", health="down"
        )
    )
    page = Elements(rp.page([node]))
    text = " ".join(page.text)
    assert page.all("svg") == []
    assert "No rollout has ended on these hosts yet." in text
    assert "no release recorded." in text


def test_the_history_is_oldest_first_whatever_state_each_release_is_in():
    after_rollback = history(rp.recorded("rollback"))
    assert [(p.id, p.state) for p in after_rollback] == [
        ("89cd83e69ffe", CURRENT),  # recorded 04:45:59, served again
        ("4910b1c7c77e", ROLLED_BACK_FROM),  # recorded 04:46:59
    ]
    after_rollout = history(rp.recorded("rollout"))
    assert [p.state for p in after_rollout] == [PREVIOUS, CURRENT]
    assert [p.figures.kind for p in after_rollout] == ["baseline", "gate"]  # type: ignore[union-attr]


def test_the_page_is_self_contained():
    page = rp.page()
    tags = Elements(page).tags
    assert {t for t, _ in tags} <= {
        "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p", "ul",
        "li", "b", "main", "section", "table", "thead", "tbody", "tr", "th", "td", "div", "span",
        "svg", "text", "tspan", "line", "path", "circle",
    }  # fmt: skip
    assert not any(k in ("src", "href") or k.startswith("on") for _, a in tags for k in a)
    assert "url(" not in page and "@import" not in page


# --- what a node says is text, never markup -------------------------------------------------


def test_node_supplied_text_is_escaped_everywhere_it_appears():
    """A node's root can write its records (release names, verdicts, the rollout's words) and
    its errors; on the page they are text: no element, no attribute, no terminal escape."""
    rel = rp.recorded("rollout")
    cur = rel.current
    assert cur is not None
    evil = replace(
        cur,
        version=f"b1{HOSTILE}"[:64],
        perf={**(cur.perf or {}), "verdict": HOSTILE, "kind": HOSTILE, "measured_at": HOSTILE},
    )
    records = Releases(evil, rel.previous)
    rollout = rp.the_rollout()
    rollout["gpu-node-1"] = HostRollout(
        "gpu-node-1", HOSTILE, HOSTILE, HOSTILE, detail=HOSTILE, perf=HOSTILE
    )
    last = {n: replace(r, message=HOSTILE) for n, r in rp.rollout_records(rollout).items()}
    last["gpu-node-1"] = replace(last["gpu-node-1"], rollout_id="29991231T000000-" + HOSTILE[:40])
    status = NodeStatus(
        "gpu-node-1", role=HOSTILE, engine=HOSTILE, engine_detail=HOSTILE, model=HOSTILE,
        service=HOSTILE, health=HOSTILE, release=HOSTILE, previous_release=HOSTILE,
        rolled_back_from=HOSTILE,
    )  # fmt: skip
    nodes = [
        NodeReport(status, history(records), HOSTILE, last["gpu-node-1"]),
        NodeReport(NodeStatus("gpu-node-2", error=HOSTILE), last_rollout_error=HOSTILE),
    ]
    page = rp.page(nodes)
    parsed = Elements(page)
    assert not parsed.all("script") and not parsed.all("img")
    assert not any(k.startswith("on") or k == "src" for _, a in parsed.tags for k in a)
    assert "\x1b" not in page and "\u202e" not in page
    text = " ".join(parsed.text)
    # shown as written: the markup as text, the controls as escapes (core.node_output.shown)
    assert "<script>alert(1)</script><img src=x onerror=" in text
    assert "\\x1b[31m" in text and "\\u202e" in text
    assert text.count("<script>") >= 10  # status, rollout, history, errors: each escaped


def test_the_svg_escapes_release_names():
    svg = line_chart("ttft", HOSTILE, HOSTILE, [(HOSTILE, HOSTILE)], [0.5])
    parsed = Elements(svg)
    assert {t for t, _ in parsed.tags} == {
        "svg",
        "text",
        "line",
        "title",
        "tspan",
        "path",
        "circle",
    }
    assert "<script>" in " ".join(parsed.text)


# --- the rollout's record on the node --------------------------------------------------------


def test_the_rollout_record_reads_back_what_the_rollout_wrote():
    written = rp.rollout_records(rp.the_rollout())
    one = written["gpu-node-1"]
    assert (one.rollout_id, one.batch, one.batches, one.batch_hosts) == (
        rp.ROLLOUT_ID, 1, 3, ("gpu-node-1",)
    )  # fmt: skip
    assert one.exit_code == 1  # a host was rolled back
    assert one.host["perf_after"]["decode_tok_s"] == pytest.approx(159.64469234005202)
    assert LastRollout.loads(one.dumps()) == one


def test_the_view_puts_the_newest_rollout_back_together_batch_by_batch():
    hosts = rp.the_rollout()
    now = rp.rollout_records(hosts, batch=2)
    older = replace(now["gpu-node-3"], rollout_id="20261101T000000-aaaaaa")
    view = RolloutView.of({"gpu-node-1": now["gpu-node-1"], "gpu-node-3": older})
    assert view is not None and view.rollout_id == rp.ROLLOUT_ID and view.count == 2
    # gpu-node-2's record was not read (unreachable now): its batch still names it
    assert [(n, [h for h, _ in m]) for n, m in view.batches] == [(1, ["gpu-node-1", "gpu-node-2"])]
    assert dict(view.batches[0][1])["gpu-node-2"] is None
    assert [n for n, _ in view.older] == ["gpu-node-3"]
    assert RolloutView.of({}) is None


@pytest.mark.parametrize(
    "change,said",
    [
        ({"batch": 4}, "'batch' is not between 1 and 'batches'"),
        ({"batch": True}, "'batch' is not a whole number"),
        ({"batch_hosts": "gpu-node-1"}, "'batch_hosts' is not a list of host names"),
        ({"host": {"name": "a", "result": "upgraded", "converge_s": "35"}}, "'converge_s' has"),
        ({"host": {"name": "a", "result": "upgraded", "again": 1}}, "'again' has the wrong type"),
        ({"host": {"result": "upgraded"}}, "'name' and 'result' are required"),
        ({"host": {"name": "a", "result": "x", "rm": "-rf"}}, "unknown key 'rm'"),
        ({"message": "x" * 20_000}, "'message' is not a text of at most"),
        ({"rollout_id": "a\nb"}, "'rollout_id' is not a line of text"),
        ({"extra": 1}, "unknown key 'extra'"),
    ],
)
def test_a_rollout_record_that_is_not_servefleets_is_refused_in_one_line(change, said):
    doc = json.loads(rp.rollout_records(rp.the_rollout())["gpu-node-1"].dumps())
    with pytest.raises(RecordError, match=re.escape(said)):
        LastRollout.loads(json.dumps({**doc, **change}))


# --- the command -----------------------------------------------------------------------------


def test_json_has_the_fleet_verbs_shape_and_names_the_page():
    doc = cli_report.to_json(rp.fleet(), 3, "/tmp/fleet-report.html")
    assert {"hosts", "summary", "exit_code", "error", "output"} <= set(doc)
    assert doc["summary"] == {
        "hosts": 4, "read": 3, "not_read": 1, "healthy": 2, "with_figures": 2,
    }  # fmt: skip
    one = doc["hosts"]["gpu-node-1"]
    assert [p["figures"]["kind"] for p in one["history"]] == ["baseline", "gate"]
    assert one["last_rollout"]["host"]["result"] == "upgraded"
    json.dumps(doc)  # all of it is JSON


def test_the_summary_names_the_page_and_the_hosts_not_read():
    text = cli_report.summary(rp.fleet(), "/tmp/fleet-report.html")
    assert text.splitlines() == [
        "wrote /tmp/fleet-report.html",
        "  4 host(s): 2 healthy, 1 not read; 2 with bench figures charted",
        f"  last rollout: {rp.ROLLOUT_ID}, exit 1",
        "  gpu-node-4: not read: connection refused",
    ]


def test_a_page_that_cannot_be_written_is_refused_before_any_host_is_reached(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "report", "inventory/spark.py",
         "-o", str(tmp_path / "no-such-dir" / "r.html"), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == f"servefleet report: -o {tmp_path}/no-such-dir/r.html: no directory " \
        f"{tmp_path}/no-such-dir\n"  # fmt: skip
    assert json.loads(proc.stdout)["exit_code"] == 2


class Host:
    def __init__(self, name: str) -> None:
        self.name, self.state, self.data = name, None, {"servefleet_root": "/opt/servefleet"}


class Session:
    def __init__(self, names) -> None:
        self.hosts = [Host(n) for n in names]

    def each(self, func):
        return {h.name: func(h) for h in self.hosts}


def test_a_rollout_leaves_its_record_on_each_host_and_says_where_it_could_not(monkeypatch):
    written, said = {}, []

    def put(state, host, path, content):
        written[host.name] = (path, content)
        return host.name != "gpu-node-2"  # its disk is full

    monkeypatch.setattr(rollout_record, "put", put)
    report = RolloutReport(rp.ROLLOUT_ID, rp.the_rollout(), message="stopped after 1")
    groups = [["gpu-node-1", "gpu-node-2"], ["gpu-node-3"]]
    rollout_record.save(lambda names: nullcontext(Session(names)), report, groups, said.append)
    assert set(written) == {"gpu-node-1", "gpu-node-2", "gpu-node-3"}
    path, content = written["gpu-node-3"]
    assert path == "/opt/servefleet/state/last-rollout.json"
    rec = LastRollout.loads(content.decode())
    assert (rec.batch, rec.batches, rec.batch_hosts, rec.result) == (
        2,
        2,
        ("gpu-node-3",),
        "untouched",
    )
    assert rec.message == "stopped after 1" and rec.exit_code == 1
    assert said == [
        "gpu-node-2: the rollout's record (for `servefleet report`) was not written: the upload "
        "failed"
    ]

    def unreachable(names):
        raise OSError("no route to host")

    said.clear()
    rollout_record.save(unreachable, report, groups, said.append)  # the report still stands
    assert len(said) == 3 and all(s.endswith("was not written: no route to host") for s in said)
