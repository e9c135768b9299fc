"""Node output over SSH, against pyinfra's own reader: a fact read in servefleet's batch
(servefleet/facts/batch.py) gives what it gives read alone. A command that fails fails the
host as pyinfra fails it alone; an answer cut short (pyinfra's reader stops at a byte that is
not UTF-8) is read again, so the facts planned after it still get their real answers."""

from __future__ import annotations

import json
import re

import pytest

from servefleet_dev.testing.pyinfra_cli import pyinfra

pytestmark = pytest.mark.e2e
PROBE = "servefleet_dev/testing/deploys/batch_probe.py"
HOST = "rtx4090-1"


def probe(case: str, alone: bool):
    run = pyinfra(
        "inventory/testbed.py",
        PROBE,
        limit=HOST,
        timeout=300,
        env={"PROBE_CASE": case, "PROBE_ALONE": "1" if alone else "0"},
    )
    found = re.search(r"^PROBE (\{.*\})$", run.output, re.M)
    return run, json.loads(found.group(1)) if found else None


def test_a_failing_fact_fails_the_host_in_the_batch_as_alone(testbed):
    batched, alone = probe("fails", alone=False), probe("fails", alone=True)
    for run, _ in (batched, alone):
        assert run.returncode != 0, run.output[-2000:]
        assert "could not load fact" in run.output and "Exits" in run.output, run.output[-2000:]
        assert "Traceback" not in run.output, run.output[-2000:]
    assert batched[0].returncode == alone[0].returncode


def test_an_answer_cut_short_leaves_no_fact_after_it_with_a_default(testbed):
    (run, got), (run_alone, got_alone) = probe("bytes", alone=False), probe("bytes", alone=True)
    assert got is not None and got_alone is not None, run.output[-2000:] + run_alone.output[-2000:]
    assert got["arch"] == got_alone["arch"] == "x86_64", (got, got_alone)
    assert got == got_alone
