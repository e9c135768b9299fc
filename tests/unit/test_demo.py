"""`servefleet demo` judges each step per host, whatever the other hosts did (#30 Broken 1), and
ends with one line saying what passed and what did not, its exit code following it.

The steps run here against a fake fleet (the verbs' results as they return them): the field's
case, spark-1 gone mid-demo, made `servefleet drift` exit 3, and the demo printed `drift caught:
NO` although rtx4090-1 was listed as drifted, skipped the repairing converge, and ended with no
verdict. The real demo runs in tests/e2e/test_demo.py."""

import argparse
import io
import json
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from servefleet.core.drift_items import DRIFTED, IN_SYNC, Item
from servefleet.core.layout import LLAMA_UNIT, NodeLayout
from servefleet.verbs.bench import NodeResult
from servefleet.verbs.drift import UNCHECKED, HostReport, Report as DriftReport
from servefleet.verbs.session import HostOutcome
from servefleet.verbs.status import NodeStatus
from servefleet_dev.cli import demo, demo_judge as judge, demo_steps
from servefleet_dev.cli.demo_report import FAIL, PASS, UNREACHABLE, Report

HOSTS = ["spark-1", "rtx4090-1", "depot-1"]
REPO = Path(__file__).resolve().parents[2]
UNIT = NodeLayout.unit_path(LLAMA_UNIT)
LINE = re.compile(r"^demo: (PASSED|FAILED): (.+); exit (\d+)$")


class FakeFleet:
    """The verbs the demo runs, answering as the real ones do for the hosts that are up; a
    host in `down` is unreachable from the step named `down_from` on."""

    def __init__(self, down_from: str | None = None, down: str = "spark-1", catch: bool = True):
        self.step, self.down_from, self.down, self.catch = "up", down_from, down, catch
        self.edited = False
        self.calls: list[tuple] = []

    def is_down(self, name: str) -> bool:
        order = [k for k in ("up", "converge", "again", "drift", "inject", "bench", "status")]
        return (
            name == self.down
            and self.down_from is not None
            and order.index(self.step) >= order.index(self.down_from)
        )

    def converge(self, inventory, deploy, limit=None, on_operation=None):
        self.calls.append(("converge", deploy, tuple(limit or ())))
        out = {}
        for n in limit or HOSTS:
            if self.is_down(n):
                out[n] = HostOutcome(n, False, error="No route to host", unreachable=True)
            else:
                repair = self.edited and n == "rtx4090-1" and deploy.endswith("llamacpp.py")
                changed = 2 if repair else 5 if self.step == "converge" else 0
                out[n] = HostOutcome(n, True, changed, 40)
                if repair:
                    self.edited = False
        return out

    def check(self, inventory, deploy, limit=None, **kw):
        self.calls.append(("drift", deploy, tuple(limit or ())))
        rep = DriftReport(inventory, deploy)
        for n in limit or HOSTS:
            h = rep.hosts[n] = HostReport(n)
            if self.is_down(n):
                h.status, h.error, h.unreachable = UNCHECKED, "No route to host", True
            elif self.edited and self.catch and n == "rtx4090-1" and "llamacpp" in deploy:
                h.status = DRIFTED
                h.items = [Item("deep", f"unit {UNIT}", DRIFTED, "rendered", "1 line differs")]
            else:
                h.items = [Item("operation", "Base | Packages", IN_SYNC)]
        return rep

    def bench(self, inventory, limit, runs, prompt_tokens, max_tokens):
        return [
            NodeResult(n, False, "No route to host", unreachable=True)
            if self.is_down(n)
            else NodeResult(n, True, prompt_tokens=256, median_ttft_s=0.05, median_decode_tok_s=9)
            for n in limit
        ]

    def status(self, inventory, limit=None):
        out = []
        for n in limit:
            role = n.rsplit("-", 1)[0]
            if self.is_down(n):
                out.append(NodeStatus(n, role, error="No route to host", unreachable=True))
            elif role == "depot":
                out.append(NodeStatus(n, role))
            else:
                out.append(
                    NodeStatus(
                        n, role, "e", service="active", enabled=True, health="200", release="r"
                    )
                )
        return sorted(out, key=lambda st: st.host)  # as status() returns them

    def ssh(self, name, command):
        self.calls.append(("ssh", name, command))
        if self.is_down(name):
            return subprocess.CompletedProcess([], 255, "", "ssh: No route to host")
        self.edited = True
        return subprocess.CompletedProcess([], 0, "", "")


@pytest.fixture
def fleet(monkeypatch):
    def make(**kw) -> FakeFleet:
        f = FakeFleet(**kw)
        monkeypatch.setattr(demo_steps.lifecycle, "up", lambda names, log: None)
        monkeypatch.setattr(
            demo_steps.lifecycle,
            "status",
            lambda: [{"name": n, "systemd": "running"} for n in HOSTS],
        )
        monkeypatch.setattr(demo_steps.material, "prepare", lambda log: None)
        monkeypatch.setattr(demo_steps, "converge", f.converge)
        monkeypatch.setattr(demo_steps.drift, "check", f.check)
        monkeypatch.setattr(demo_steps, "bench", f.bench)
        monkeypatch.setattr(demo_steps, "status", f.status)
        monkeypatch.setattr(demo_steps.Demo, "_ssh", f.ssh)
        step = demo_steps.Demo.step

        def told(self, key, *args, **kw):  # the fleet hears which step runs
            f.step = key
            return step(self, key, *args, **kw)

        monkeypatch.setattr(demo_steps.Demo, "step", told)
        return f

    return make


def run_demo(fleet: FakeFleet) -> tuple[Report, str]:
    """The demo's steps in order (the fleet hears each: a host goes down between them), on an
    80-column console."""
    out = io.StringIO()
    report = Report(list(HOSTS), 70)
    d = demo_steps.Demo(Console(file=out, width=80), report, list(HOSTS))
    d.up()
    d.converge_all("converge")
    d.converge_all("again")
    d.in_sync()
    d.inject()
    d.bench()
    d.status()
    return report, out.getvalue()


def verdicts(report: Report) -> dict:
    return {k: {h: v.verdict for h, v in s.items()} for k, s in report.steps.items()}


def test_every_step_passes_on_every_host(fleet):
    report, out = run_demo(fleet())
    assert verdicts(report) == {
        "up": dict.fromkeys(HOSTS, PASS),
        "converge": dict.fromkeys(HOSTS, PASS),
        "again": dict.fromkeys(HOSTS, PASS),
        "drift": dict.fromkeys(HOSTS, PASS),
        "inject": {"rtx4090-1": PASS},
        "bench": {"spark-1": PASS, "rtx4090-1": PASS},
        "status": dict.fromkeys(HOSTS, PASS),
    }
    assert report.exit_code == 0
    assert report.final_line() == "demo: PASSED: every step on every host; exit 0"
    assert "step 5 verdict: rtx4090-1 pass" in out
    assert "rtx4090-1: caught, repaired (2 changes), in sync again" in out
    assert all(len(line) <= 80 for line in out.splitlines()), out


def test_a_host_gone_mid_demo_is_unreachable_and_the_others_still_count(fleet):
    f = fleet(down_from="converge")
    report, out = run_demo(f)
    v = verdicts(report)
    assert v["up"] == dict.fromkeys(HOSTS, PASS)
    for step in ("converge", "again", "drift", "status"):
        assert v[step] == {"spark-1": UNREACHABLE, "rtx4090-1": PASS, "depot-1": PASS}, step
    assert v["bench"] == {"spark-1": UNREACHABLE, "rtx4090-1": PASS}
    # The field's case: the drift check of the whole testbed exits 3 (spark-1 unchecked), and
    # the drift on rtx4090-1 is caught all the same; its repairing converge runs.
    assert v["inject"] == {"rtx4090-1": PASS}
    assert "drift caught on rtx4090-1: yes (its unit file)" in out
    assert ("converge", demo_steps.Q4, ("rtx4090-1",)) in f.calls
    assert not f.edited  # not left with the hand-edited unit
    assert "spark-1: No route to host" in out
    # Each step's line names the hosts in the same order, however the verb returned them.
    assert "step 7 verdict: spark-1 unreachable, rtx4090-1 pass, depot-1 pass" in out
    assert report.exit_code == 3
    line = report.final_line()
    assert line == "demo: FAILED: spark-1 unreachable at 2, 3, 4, 6, 7; all else passed; exit 3"
    assert LINE.match(line)


def test_a_drift_not_caught_fails_that_host_and_the_node_is_repaired_all_the_same(fleet):
    f = fleet(catch=False)
    report, out = run_demo(f)
    assert verdicts(report)["inject"] == {"rtx4090-1": FAIL}
    assert "drift caught on rtx4090-1: NO" in out
    assert "rtx4090-1: drift not caught (the check found it in_sync)" in out
    assert ("converge", demo_steps.Q4, ("rtx4090-1",)) in f.calls  # repaired whatever
    assert report.exit_code == 1
    assert report.final_line() == "demo: FAILED: rtx4090-1 failed at 5; all else passed; exit 1"


def test_the_llama_host_gone_before_the_edit_is_unreachable_at_it(fleet):
    report, out = run_demo(fleet(down_from="inject", down="rtx4090-1"))
    v = verdicts(report)
    assert v["inject"] == {"rtx4090-1": UNREACHABLE}
    assert v["bench"] == {"spark-1": PASS, "rtx4090-1": UNREACHABLE}
    assert "could not hand-edit" in out
    assert report.final_line() == (
        "demo: FAILED: rtx4090-1 unreachable at 5, 6, 7; all else passed; exit 3"
    )


def test_a_step_whose_own_work_raises_fails_its_hosts_and_the_demo_goes_on(fleet, monkeypatch):
    f = fleet()

    def broken(*a, **kw):
        raise RuntimeError("the hub is down")

    monkeypatch.setattr(demo_steps, "bench", broken)
    report, out = run_demo(f)
    v = verdicts(report)
    assert v["bench"] == {"spark-1": FAIL, "rtx4090-1": FAIL}
    assert v["status"] == dict.fromkeys(HOSTS, PASS)  # the next step ran
    assert "spark-1: not checked: RuntimeError: the hub is down" in out
    assert report.final_line() == (
        "demo: FAILED: spark-1 failed at 6; rtx4090-1 failed at 6; all else passed; exit 1"
    )


def test_failures_and_unreachable_hosts_together_exit_3_and_name_both():
    report = Report(["spark-1", "rtx4090-1"])
    report.judge("up", "spark-1", PASS)
    report.judge("up", "rtx4090-1", PASS)
    report.judge("converge", "spark-1", FAIL, "deploys/serve_bf16.py: health check failed")
    report.judge("converge", "spark-1", PASS)  # the first verdict stands
    report.judge("converge", "rtx4090-1", PASS)
    report.judge("drift", "spark-1", UNREACHABLE, "No route to host")
    report.judge("drift", "rtx4090-1", FAIL, "drifted")
    assert report.exit_code == 3
    assert report.final_line() == (
        "demo: FAILED: spark-1 failed at 2; spark-1 unreachable at 4; rtx4090-1 failed at 4; "
        "all else passed; exit 3"
    )
    grid = report.grid(80).splitlines()
    assert grid[0].split() == ["step", "spark-1", "rtx4090-1"]
    assert grid[2].split() == ["2", "converge", "fail", "pass"]
    assert grid[3].split() == ["4", "in", "sync", "unreachable", "fail"]
    doc = report.to_json()
    assert doc["exit_code"] == 3 and doc["error"] is None
    assert doc["summary"] == {"hosts": 2, "passed": 0, "failed": 2, "unreachable": 0}
    assert doc["hosts"]["spark-1"]["steps"]["drift"] == {
        "verdict": "unreachable",
        "detail": "No route to host",
    }
    assert doc["line"] == report.final_line() and [s["key"] for s in doc["steps"]][:2] == [
        "up",
        "converge",
    ]
    json.dumps(doc)


def test_nothing_judged_is_no_pass():
    report = Report(["spark-1"])
    assert report.exit_code == 1
    assert report.final_line() == "demo: FAILED: no step judged; nothing passed; exit 1"


def test_the_grid_fits_80_columns_with_many_hosts():
    names = [f"rtx4090-{n}" for n in range(1, 9)]
    report = Report(names)
    for n in names:
        report.judge("up", n, UNREACHABLE)
    assert all(len(line) <= 80 for line in report.grid(80).splitlines())
    assert all(len(line) <= 80 for line in report.step_lines("up", 80))


def test_judging_converges_a_second_run_that_changes_something_fails():
    ok = HostOutcome("spark-1", True, 0, 40)
    changed = HostOutcome("spark-1", True, 2, 40)
    assert judge.converged([("deploys/base.py", ok)], again=True) == (PASS, "")
    assert judge.converged([("deploys/serve_bf16.py", changed)], again=True) == (
        FAIL,
        "deploys/serve_bf16.py: 2 of 40 operations changed, expected none",
    )
    assert judge.converged([]) == (FAIL, "no converge reached it")


def test_a_host_down_at_the_check_is_unreachable_and_a_failed_fact_fails():
    down = HostReport("spark-1", UNCHECKED, "No route to host", unreachable=True)
    fact = HostReport("spark-1", UNCHECKED, "RuntimeError: a fact could not be read")
    assert judge.in_sync([("d", down)]) == (UNREACHABLE, "No route to host")
    assert judge.in_sync([("d", fact)]) == (
        FAIL,
        "d: unchecked: RuntimeError: a fact could not be read",
    )


def test_the_run_ends_with_the_verdicts_and_one_line_and_exits_by_it(fleet, monkeypatch, capsys):
    """--json: the story on stderr, ending with the grid and the final line; stdout holds the
    JSON object alone (the fleet verbs' shape), its exit code the process's."""
    fleet(down_from="converge")
    monkeypatch.setattr(demo, "needs_root", lambda command: None)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SERVEFLEET_TESTBED_INSTANCE", "70")
    monkeypatch.setenv("COLUMNS", "80")
    rc = demo.run(demo_parser().parse_args(["demo", "--json"]))
    out, err = capsys.readouterr()
    doc = json.loads(out)
    lines = err.splitlines()
    line = "demo: FAILED: spark-1 unreachable at 2, 3, 4, 6, 7; all else passed; exit 3"
    assert rc == doc["exit_code"] == 3 and lines[-1] == doc["line"] == line
    assert doc["instance"] == 70 and doc["error"] is None
    assert doc["summary"] == {"hosts": 3, "passed": 2, "failed": 0, "unreachable": 1}
    assert doc["hosts"]["rtx4090-1"] == {
        "verdict": "passed",
        "steps": {
            "up": {"verdict": "pass", "detail": ""},
            "converge": {"verdict": "pass", "detail": "10 operations changed"},
            "again": {"verdict": "pass", "detail": ""},
            "drift": {"verdict": "pass", "detail": ""},
            "inject": {"verdict": "pass", "detail": "caught, repaired (2 changes), in sync again"},
            "bench": {"verdict": "pass", "detail": "9.0 tok/s, TTFT 0.050 s"},
            "status": {"verdict": "pass", "detail": ""},
        },
    }
    grid = lines[lines.index(next(ln for ln in lines if "Verdicts" in ln)) + 1 : -1]
    assert [row.split() for row in grid] == [
        ["step", "spark-1", "rtx4090-1", "depot-1"],
        ["1", "testbed", "up", "pass", "pass", "pass"],
        ["2", "converge", "unreachable", "pass", "pass"],
        ["3", "nothing", "to", "change", "unreachable", "pass", "pass"],
        ["4", "in", "sync", "unreachable", "pass", "pass"],
        ["5", "drift", "caught,", "fixed", "-", "pass", "-"],
        ["6", "bench", "unreachable", "pass", "-"],
        ["7", "status", "unreachable", "pass", "pass"],
    ]
    assert all(len(ln) <= 80 for ln in lines), err


def test_the_demo_takes_json_and_refuses_bad_host_names_before_anything(monkeypatch, capsys):
    monkeypatch.setattr(demo, "needs_root", lambda command: None)
    parser = demo_parser()
    args = parser.parse_args(["demo", "--json", "--hosts", "gpu-1"])
    assert args.json
    with pytest.raises(demo.InputError, match="must start with a role"):
        demo.run(args)


def demo_parser():
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers(dest="command"))
    return parser
