"""80-column tables keep the part a user needs (#30): the drift item's name, the engine and its
version in status, the target release in rollout, the knob's meaning in `servefleet knobs`; the
rest is --wide's. Rendered by the commands' own render functions, at COLUMNS=80."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.cli import drift as drift_cli, rollout as rollout_cli, status as status_cli
from servefleet.cli.knobs import rows, sections
from servefleet.core.drift_items import DRIFTED, Item
from servefleet.verbs.drift import HostReport, Report
from servefleet.verbs.rollout_report import HostRollout, RolloutReport
from servefleet.verbs.status import NodeStatus

REPO = Path(__file__).resolve().parents[2]
ENGINE = "llama.cpp b9785-patch1"
TARGET = "llama.cpp b9785-patch1 (unit +--ubatch-size 1)"


@pytest.fixture(autouse=True)
def columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def fits(text: str) -> bool:
    return all(len(line) <= 80 for line in text.splitlines())


def test_status_keeps_the_engine_and_its_version_whole():
    nodes = [
        NodeStatus(
            "rtx4090-gpu-node-01",
            "rtx4090",
            ENGINE,
            f"{ENGINE} (4f2e1a9b0, b9785-patch1-0-g4f2e1a9)",
            "unsloth/Qwen3-30B-A3B-Instruct-2507-GGUF",
            "main -> 0123456789ab",
            "active",
            True,
            "200",
            8080,
            release=TARGET,
            previous_release="llama.cpp b9785 (unit -ubatch)",
        ),
        NodeStatus("spark-01", "spark", "vllm 0.24.0", model="Qwen/Qwen-AgentWorld-35B-A3B"),
    ]
    out = status_cli.render(nodes)
    assert fits(out), out
    row = out.splitlines()[1]
    assert row.startswith("rtx4090-gpu-node-01  rtx4090  ") and f"  {ENGINE}  " in row, out
    assert "vllm 0.24.0" in out and "llama.cpp b9785 (unit" not in out  # previous: --wide
    wide = status_cli.render(nodes, wide=True)
    assert "llama.cpp b9785 (unit -ubatch)" in wide and "Qwen3-30B-A3B-Instruct-2507-GGUF" in wide


def test_drift_keeps_the_items_name_whole():
    name = "unit /etc/systemd/system/servefleet-llama.service"
    host = HostReport(
        "rtx4090-1",
        DRIFTED,
        items=[Item("deep", name, DRIFTED, "the rendered unit " * 4, "RestartSec=1 " * 8)],
    )
    out = drift_cli.render(Report("inventory/testbed.py", "deploys/x.py", {"rtx4090-1": host}))
    assert fits(out), out
    assert f"  {name}  " in out, out
    assert "RestartSec=1 " * 8 in drift_cli.render(
        Report("inventory/testbed.py", "deploys/x.py", {"rtx4090-1": host}), wide=True
    )


def test_rollout_keeps_the_target_release_whole_and_the_detail_below():
    detail = "performance gate failed: decode 40.0 -> 20.0 tok/s (-50.0 %, limit -10 %) FAILED"
    report = RolloutReport(
        "r1",
        {
            "rtx4090-gpu-node-01": HostRollout(
                "rtx4090-gpu-node-01",
                "llama.cpp b9785 (unit -ubatch)",
                TARGET,
                "rolled back",
                30.0,
                5.0,
                4.0,
                detail,
            ),
        },
    )
    out = rollout_cli.render(report)
    assert fits(out), out
    assert f"  {TARGET}  rolled back" in out, out
    assert detail in " ".join(line.strip() for line in out.splitlines())  # wrapped, not cut
    wide = rollout_cli.render(report, wide=True)
    assert "llama.cpp b9785 (unit -ubatch)" in wide and "conv s" in wide and detail in wide


def servefleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli", *args],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_knobs_keeps_every_meaning_whole_at_80_columns():
    proc = servefleet("knobs")
    assert proc.returncode == 0, proc.stderr
    assert fits(proc.stdout) and "…" not in proc.stdout, proc.stdout
    flat = " ".join(proc.stdout.split())
    for group, _ in sections():
        for key, _, _, doc in rows(group):
            assert f"{key} {' '.join(doc.split())}" in flat, key


def test_knobs_wide_has_the_defaults_and_recipes():
    proc = servefleet("knobs", "--wide")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("service_port "))
    assert line.split()[:3] == ["service_port", "8000", "serve_bf16,"], line
    assert line.endswith("port of the OpenAI-compatible API (vLLM's usual one)")
