"""`servefleet report` on the testbed: a real performance-gated rollout on the llama.cpp host (a
new release as fast as the old: the unit spells out llama-server's default --ubatch-size), then
the report of the session's hosts, opened in headless Chromium. The page shows what the nodes
recorded: the rollout's batch and verdict as the rollout's own --json said them, the host's two
releases with the gate's real figures, one point per release in each chart; the depot has no
release history; the record the rollout left on the node reads back as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from servefleet.cli.report_svg import COLOURS
from servefleet_dev.testbed import material
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra
from tests.unit.browser import charts, chromium, screenshot
from tests.unit.report_pages import Elements, points

pytestmark = pytest.mark.e2e
INVENTORY, Q4 = "inventory/testbed.py", "deploys/serve_q4_llamacpp.py"
LLAMA, DEPOT = "rtx4090-1", "depot-1"
ROOT = "/opt/servefleet"
# The testbed's arguments (group_data/testbed_llamacpp.py) and llama-server's default ubatch
# written out: another unit, so another release, serving exactly as before.
SAME_SPEED = '["--threads","1","--ubatch-size","512"]'
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def reported(testbed, tmp_path_factory):
    """(the rollout's --json, the report's --json, the page) after the rollout; the host is
    converged back to the data's release afterwards."""
    material.prepare(spark=False)
    run = pyinfra(INVENTORY, Q4, limit=LLAMA, timeout=3600)
    assert run.returncode == 0, run.output[-4000:]
    out = cli(
        "rollout", INVENTORY, Q4, "--limit", LLAMA, "--data",
        f"llamacpp_server_args={SAME_SPEED}", "--json",
    )  # fmt: skip
    rollout = json.loads(out.stdout)
    # upgraded; on a machine busy enough the gate may judge it slower and send it back: the
    # report must say whichever happened
    assert rollout["exit_code"] in (0, 1) and rollout["hosts"][LLAMA]["to_release"], out.stderr
    page = tmp_path_factory.mktemp("report") / "fleet.html"
    rep = cli("report", INVENTORY, "-o", str(page), "--json")
    yield rollout, rep, page
    back = pyinfra(INVENTORY, Q4, limit=LLAMA, timeout=3600)
    assert back.returncode == 0, back.output[-4000:]


def test_the_report_reads_every_host_and_writes_the_page(reported):
    _, rep, page = reported
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert {"hosts", "summary", "exit_code", "error", "output"} <= set(doc)
    assert doc["output"] == str(page) and page.is_file()
    assert doc["summary"]["not_read"] == 0 and doc["summary"]["hosts"] == len(doc["hosts"])
    assert {LLAMA, DEPOT} <= set(doc["hosts"])
    assert doc["hosts"][DEPOT]["history"] == [] and doc["hosts"][DEPOT]["last_rollout"] is None


def test_the_rollouts_record_on_the_node_is_what_the_rollout_reported(reported, th):
    rollout, rep, _ = reported
    raw = th(LLAMA).file(f"{ROOT}/state/last-rollout.json")
    assert raw.user == "root" and raw.mode == 0o644
    record = json.loads(raw.content_string)
    ours = rollout["hosts"][LLAMA]
    assert record["rollout_id"] == rollout["rollout_id"]
    assert (record["batch"], record["batches"], record["batch_hosts"]) == (1, 1, [LLAMA])
    assert record["host"] == ours and record["exit_code"] == rollout["exit_code"]
    assert json.loads(rep.stdout)["hosts"][LLAMA]["last_rollout"] == record


def test_the_history_holds_the_gates_real_figures_on_both_releases(reported, th):
    rollout, rep, _ = reported
    history = json.loads(rep.stdout)["hosts"][LLAMA]["history"]
    releases = json.loads(th(LLAMA).file(f"{ROOT}/state/releases.json").content_string)
    kept = [
        r for r in (releases["current"], *releases["previous"], releases["rolled_back_from"]) if r
    ]
    assert len(history) == len(kept) >= 2
    ours = rollout["hosts"][LLAMA]
    if ours["result"] != "upgraded":  # sent back: measured again since, the figures are others
        return
    mine = {p["figures"]["kind"]: p for p in history if p["figures"]
            and p["figures"]["rollout"] == rollout["rollout_id"]}  # fmt: skip
    # the baseline on the release served before, the gate's figures on the new one
    assert mine["baseline"]["state"] == "previous" and mine["gate"]["state"] == "current"
    for kind, measured in (("baseline", ours["perf_before"]), ("gate", ours["perf_after"])):
        figures = mine[kind]["figures"]
        assert (figures["decode_tok_s"], figures["ttft_s"]) == (
            measured["decode_tok_s"], measured["ttft_s"],
        )  # fmt: skip


def test_chromium_renders_the_rollout_and_the_hosts_charts(reported, tmp_path):
    rollout, rep, page = reported
    history = json.loads(rep.stdout)["hosts"][LLAMA]["history"]
    measured = sum(bool(p["figures"]) for p in history)
    dom = Elements(chromium(tmp_path, "--dump-dom", page.as_uri()).stdout)
    text = " ".join(" ".join(dom.text).split())  # as it reads: one space between words
    assert f"Rollout {rollout['rollout_id']}" in text and "Batch 1 of 1" in text
    assert rollout["hosts"][LLAMA]["result"] in text
    # the llama.cpp host's charts: after its heading, a decode and a TTFT line, a point for
    # each release measured
    start = next(i for i, (t, a) in enumerate(dom.tags) if a.get("id") == f"history-{LLAMA}")
    after = [a for t, a in dom.tags[start:] if t == "path" and a.get("class") == "series"][:2]
    assert [a["stroke"] for a in after] == [COLOURS["decode"], COLOURS["ttft"]]
    assert [sum(len(s) for s in points(a["d"])) for a in after] == [measured, measured]
    image = screenshot(tmp_path, "shot.html", page.read_text(), (1280, 3000))
    for series in ("decode", "ttft"):
        assert charts(image, COLOURS[series]), f"no {series} chart drawn"
