"""`servefleet rollout` and `servefleet rollback` on the testbed, for real.

llama.cpp: a real upgrade between two real releases, b9785 (the recipe's) and b9785-patch1 (a
later commit that changes no compiled code: exactly as fast), on two hosts in batches of one
(the second batch waits on the first's gate: two show what three would, at a third less cost);
a failing upgrade that changes the build too (the patch release with the overrides turned off
for the defective GGUF) is
rolled back on the first host and stops the rollout; the rollout is interrupted at three points
and a rerun finishes or rolls back. The performance gate, on the real llama-server only: the
upgrade of the two hosts is as fast and passes it; the same release made genuinely slower (the
server on one thread of the guests' two) fails it and is rolled back to the faster one;
--no-perf-gate lets it through, and `bench --compare` finds it slower than its previous release.
vLLM: 0.24.0 -> 0.26.0 with the real wheels and both real patches, served by the engine stand-in
replaying 0.26.0's own recorded lines (its speed means nothing: the performance gate is off for
these hosts in the testbed's data); it rolls back when the stand-in is told to fail for 0.26.0.
Then a rollback by hand, and a converge back.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from servefleet.core import perf
from servefleet.core.groupdata import load_group
from servefleet_dev.testbed import lifecycle, material
from servefleet_dev.testbed.hosts import shared_dir
from servefleet_dev.testing.llama_src import commits
from servefleet_dev.testing.load import BENCH, compile_load
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra
from servefleet_dev.testing.wheels import vllm_wheel

pytestmark = pytest.mark.e2e
INVENTORY = "inventory/testbed.py"
Q4, BF16 = "deploys/serve_q4_llamacpp.py", "deploys/serve_bf16.py"
LLAMAS = ["rtx4090-1", "rtx4090-5"]
ROOT = "/opt/servefleet"
UNIT = "/etc/systemd/system/servefleet-llama.service"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
NEWER = "b9785-patch1"
# A genuinely slower release: the same build and model, the server evaluating the prompt one
# token per batch (--ubatch-size 1: every prompt token a pass of its own, TTFT several times the
# batched one). releases_keep 3 keeps b9785's build for the tests after these.
SLOW_ARGS = '["--threads","1","--ubatch-size","1"]'  # the testbed's --threads 1, kept
SLOW = ["--data", f"llamacpp_server_args={SLOW_ARGS}", "--data", "releases_keep=3"]
NO_GATE = "--no-perf-gate"  # for rollouts that only set the stage: the gate is tested on its own


def newer() -> list[str]:
    """--data that moves the llama.cpp hosts to the patch release (a real, other commit)."""
    return ["--data", f"llamacpp_tag={NEWER}", "--data", f"llamacpp_commit={commits()[NEWER]}"]


def rollout(*args: str, deploy: str = Q4, limit=None):
    cmd = [*CLI, "rollout", INVENTORY, deploy, "--json", *args]
    for name in limit or []:
        cmd += ["--limit", name]
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600)
    report = json.loads(out.stdout) if out.stdout.strip() else {"stderr": out.stderr}
    return out.returncode, report, out.stderr


def failed(report: dict, err: str) -> str:
    """A failed rollout in full: pytest shortens a tuple's repr, not a string."""
    return json.dumps(report, indent=1)[-8000:] + "\n" + err[-6000:]


def health(th, host: str, port: int = 8080) -> str:
    return th(host).check_output(
        f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' http://127.0.0.1:{port}/health || true"
    )


def records(th, host: str) -> dict:
    return json.loads(th(host).file(f"{ROOT}/state/releases.json").content_string)


def agree(th, host: str, unit: str = UNIT) -> dict:
    """The release records agree with what serves: the unit on disk is the current release's,
    the service runs it healthy (running.json), llama.cpp's `current` is its build."""
    h = th(host)
    rec = records(th, host)
    current = rec["current"]
    assert h.file(unit).content_string == current["unit_text"]
    running = json.loads(h.file(f"{ROOT}/state/running.json").content_string)
    assert running["release"] == release_id(current)
    if current["engine"] == "llama.cpp":
        assert h.file(f"{ROOT}/llama.cpp/current").linked_to == current["prefix"]
    return current


def release_id(doc: dict) -> str:
    from servefleet.core.releases import Release

    return Release.from_json(doc).id


def workload() -> dict:
    """The gate's workload in the testbed rtx4090 hosts' data."""
    data = {}
    for group in ("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed"):
        data.update(load_group(group))
    return {
        "runs": data["perf_gate_runs"],
        "prompt_tokens": data["perf_gate_prompt_tokens"],
        "max_tokens": data["perf_gate_max_tokens"],
    }


def thresholds() -> perf.Thresholds:
    """The gate's thresholds in the testbed rtx4090 hosts' data."""
    data = {}
    for group in ("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed"):
        data.update(load_group(group))
    return perf.Settings.of(data).thresholds


def gated(figures: dict, kind: str, rollout_id: str) -> None:
    """Figures the gate kept on the node: what measured them, with what, and the medians."""
    assert figures["kind"] == kind and figures["rollout"] == rollout_id, figures
    assert figures["workload"] == workload() and figures["measured_at"].endswith("Z")
    # One measurement, or the best of two (the gate measures again what does not pass clearly);
    # the verdict of a release measured once more leads, the earlier ones follow (rollout_again).
    lead = figures.get("verdict", "").split("; upgraded again and measured once more")[0]
    times = 2 if "best of 2" in lead else 1
    assert len(figures["runs"]) == times * workload()["runs"], figures
    assert figures["decode_tok_s"] > 0 and figures["ttft_s"] > 0


@pytest.fixture(scope="module")
def llama_fleet(testbed):
    """Two llama.cpp hosts serving b9785, the testbed's pin."""
    material.prepare(spark=False)
    for name in LLAMAS[1:]:
        lifecycle.add(name, log=lambda m: None)
    run = pyinfra(INVENTORY, Q4, limit=",".join(LLAMAS), timeout=3600)
    assert run.returncode == 0, run.output[-4000:]
    yield LLAMAS
    for name in LLAMAS[1:]:
        lifecycle.rm(name, log=lambda m: None)
    pyinfra(INVENTORY, Q4, limit=LLAMAS[0], timeout=3600)


def test_a_real_upgrade_of_two_hosts_in_batches_of_one(llama_fleet, th):
    before = {h: records(th, h)["current"] for h in LLAMAS}
    assert {c["version"] for c in before.values()} == {"b9785"}
    # The gate's figures measured beside a compile, with the rest of the test session running:
    # an equally fast release must pass a busy node's gate.
    with compile_load(during=BENCH):
        rc, report, err = rollout("--batch", "1", *newer(), limit=LLAMAS)
    assert rc == 0, failed(report, err)
    for host in LLAMAS:
        r = report["hosts"][host]
        assert r["result"] == "upgraded", r
        assert r["from_release"].startswith("llama.cpp b9785 ") and NEWER in r["to_release"]
        assert r["gate_s"] is not None and r["converge_s"] is not None
        # As fast: the performance gate passed, both figures named; both kept on the node.
        # (or, where load on the machine slowed the new release, passed against the previous
        # release measured again after the rollback, and upgraded again: perfgate.bracket)
        assert r["perf"].startswith("performance gate passed") and "decode " in r["perf"], r
        assert r["again"] == ("measured again" in r["perf"]), r
        assert r["perf_s"] > 0 and r["perf_before"] and r["perf_after"]
        current = agree(th, host)
        gated(current["perf"], "gate", report["rollout_id"])
        assert current["perf"] == r["perf_after"] and current["perf"]["verdict"] == r["perf"]
        gated(records(th, host)["previous"][0]["perf"], "baseline", report["rollout_id"])
        assert current["version"] == NEWER and current["commit"] == commits()[NEWER]
        assert health(th, host) == "200"
        # The previous release stays servable: its build is on disk.
        assert records(th, host)["previous"][0]["version"] == "b9785"
        assert th(host).file(f"{before[host]['prefix']}/bin/llama-server").exists
    assert "batch 2/2" in err  # one host per batch


def test_a_slower_release_fails_the_performance_gate_and_is_rolled_back(llama_fleet, th):
    host = LLAMAS[0]
    fast = agree(th, host)  # the patch release, gated as fast by the upgrade above
    with compile_load(during=BENCH):  # and a slower release fails a busy node's gate
        rc, report, err = rollout(*newer(), *SLOW, limit=[host])
    assert rc == 1, failed(report, err)
    r = report["hosts"][host]
    assert r["result"] == "rolled back", failed(report, err)
    assert r["gate_s"] is not None  # it was healthy: the performance gate failed it
    assert r["perf"].startswith("performance gate failed: ") and "FAILED" in r["perf"]
    assert r["perf"] in r["detail"]
    before, after = r["perf_before"], r["perf_after"]
    # The figures compared: without the engine's CPU waits where the node measured them (PSI).
    own = "own_ttft_s" in before and "own_ttft_s" in after
    assert own == ("CPU waits for other work removed" in r["perf"]), r["perf"]
    decode, ttft = ("own_decode_tok_s", "own_ttft_s") if own else ("decode_tok_s", "ttft_s")
    # The figure that failed is named with both values, and is really beyond its threshold. The
    # verdict that counted leads: against the baseline (perf_before), or, where the new release
    # was measured once more (rollout_again), against the previous release measured again after
    # the rollback; then the first verdict names the baseline.
    lead, once_more, first = r["perf"].partition("; upgraded again and measured once more")
    failed_figure = re.search(
        r"(decode|TTFT) ([0-9.]+) -> ([0-9.]+) (?:tok/s|s) \(([-+][0-9.]+) %, limit "
        r"([-+][0-9]+) %\) FAILED",
        lead,
    )
    assert failed_figure, r["perf"]
    name, was, now, change, limit = failed_figure.groups()
    key, fmt = (decode, ".1f") if name == "decode" else (ttft, ".3f")
    assert now == f"{after[key]:{fmt}}", r["perf"]  # the last figures kept
    if once_more:
        assert f"{name} {before[key]:{fmt}} -> " in first, r["perf"]
    else:
        assert was == f"{before[key]:{fmt}}", r["perf"]
    limits = thresholds()  # the testbed's, and the figure beyond it
    if name == "decode":
        assert int(limit) == -limits.decode_drop_pct and float(change) < int(limit)
    else:
        assert int(limit) == limits.ttft_rise_pct and float(change) > int(limit)
    # Back on the faster release; the node keeps both measurements.
    current = agree(th, host)
    assert release_id(current) == release_id(fast) and "--ubatch-size" not in current["unit_text"]
    assert health(th, host) == "200"
    rec = records(th, host)
    gated(rec["current"]["perf"], "baseline", report["rollout_id"])
    assert rec["current"]["perf"] == before
    slow = rec["rolled_back_from"]
    assert "--ubatch-size 1" in slow["unit_text"] and slow["version"] == NEWER
    gated(slow["perf"], "gate", report["rollout_id"])
    # The node keeps the gate's verdict, and the report names every stage of the rule
    # (verbs/rollout_again.py): slower than the previous release measured again after the
    # rollback too, then served again and slower once more; or the previous release could not
    # be measured again, and the rollback stands.
    assert slow["perf"] == after and r["perf"].startswith(slow["perf"]["verdict"])
    stages = (
        "; upgraded again and measured once more, against the previous release measured "
        "again; the first verdict: failed: ",
        "; slower than the previous release measured again too (",
    )
    assert all(s in r["perf"] for s in stages) or (
        "; the previous release could not be measured again: " in r["perf"]
    ), r["perf"]


def test_no_perf_gate_lets_the_slower_release_through(llama_fleet, th):
    host = LLAMAS[0]
    rc, report, err = rollout(NO_GATE, *newer(), *SLOW, limit=[host])
    assert rc == 0, failed(report, err)
    r = report["hosts"][host]
    assert r["result"] == "upgraded" and r["perf"] == "off (--no-perf-gate)", r
    assert r["perf_before"] is None and r["perf_after"] is None
    current = agree(th, host)
    assert "--ubatch-size 1" in current["unit_text"]
    # Its last figures, from the gate it failed above, stay with the release.
    assert current["perf"]["verdict"].startswith("performance gate failed")
    # status --wide shows both releases' figures; bench --compare finds it slower than the
    # previous release (the baseline measured before the failed attempt).
    wide = subprocess.run(
        [*CLI, "status", INVENTORY, "--limit", host, "--wide"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    prev = records(th, host)["previous"][0]["perf"]
    assert f"{prev['decode_tok_s']:.1f} tok/s, TTFT {prev['ttft_s']:.3f} s" in wide.stdout, (
        wide.stdout + wide.stderr
    )
    with compile_load(during=BENCH):
        out = subprocess.run(
            [*CLI, "bench", INVENTORY, "--limit", host, "--compare", "--json"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    doc = json.loads(out.stdout)  # --json: {"hosts": {name: ...}, "summary", "exit_code"}
    (node,) = doc["hosts"].values()
    assert doc["summary"]["slower"] == 1 and doc["exit_code"] == out.returncode
    assert out.returncode == 1 and node["ok"] and node["slower"], node
    assert node["previous"] == prev and node["now"]["workload"] == workload()
    assert any("FAILED" in line for line in node["lines"]), node


def test_a_failing_upgrade_rolls_back_the_first_host_and_leaves_the_others(llama_fleet, th):
    rc, _, err = rollout("--batch", "1", NO_GATE, limit=LLAMAS)  # back to b9785 (the data's)
    assert rc == 0, err[-3000:]
    untouched = {h: (th(h).file(UNIT).content_string, records(th, h)) for h in LLAMAS[1:]}
    rc, report, err = rollout(
        "--batch", "1", *newer(), "--data", "llamacpp_gguf_overrides=false", limit=LLAMAS
    )
    assert rc == 1, failed(report, err)
    first = report["hosts"][LLAMAS[0]]
    assert first["result"] == "rolled back", first
    assert "missing tensor 'blk.40.attn_norm.weight'" in err or "crash-looping" in first["detail"]
    assert health(th, LLAMAS[0]) == "200"
    current = agree(th, LLAMAS[0])
    assert current["version"] == "b9785"  # its old build prefix, unit and model
    assert "--override-kv" in current["unit_text"]
    for host in LLAMAS[1:]:
        assert report["hosts"][host]["result"] == "untouched"
        assert (th(host).file(UNIT).content_string, records(th, host)) == untouched[host]
    assert "stopped after 1 failed host" in report["message"]
    # Drift, with the data of that failed upgrade, shows the host rolled back from it.
    out = subprocess.run(
        [
            *CLI,
            "drift",
            INVENTORY,
            Q4,
            "--limit",
            LLAMAS[0],
            "--json",
            *newer(),
            "--data",
            "llamacpp_gguf_overrides=false",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    items = {i["name"]: i for i in json.loads(out.stdout)["hosts"][LLAMAS[0]]["items"]}
    assert items["release"]["state"] == "drifted"
    assert f"rolled back from llama.cpp {NEWER}" in items["release"]["found"]


@pytest.mark.parametrize(
    "point,after,delay",
    [
        ("during the converge", "converging", 2.0),
        ("between the converge and the gate", "gating", 0.0),
        ("during the gate", "gating", 1.5),
    ],
)
def test_an_interrupted_rollout_is_finished_by_a_rerun(llama_fleet, th, point, after, delay):
    host = LLAMAS[0]
    rc, _, err = rollout(NO_GATE, limit=[host])  # from b9785, the data's release
    assert rc == 0, err[-3000:]
    interrupted_then_rerun(th, host, point, after, delay)


def interrupted_then_rerun(th, host: str, point: str, after: str, delay: float) -> None:
    cmd = [*CLI, "rollout", INVENTORY, Q4, "--limit", host, *newer()]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen, marker = [], None
    try:
        for line in proc.stdout:
            seen.append(line)
            if f": {after}" in line:
                # The line comes before the marker: the kill lands once the node says the phase.
                marker = wait_for_marker(th, host, after)
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGKILL)  # a killed operator machine
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert marker is not None, "".join(seen)[-2000:]
    killed_at = read_marker(th, host)
    assert killed_at and killed_at["rollout_id"] == marker["rollout_id"], killed_at
    assert killed_at["phase"] == after, (point, killed_at)
    # Right after the kill, the host serves the old release or the new one.
    deadline = time.monotonic() + 60
    while health(th, host) != "200":
        assert time.monotonic() < deadline, f"{point}: no /health 200 after the kill"
        time.sleep(1)
    rc, report, err = rollout(*newer(), limit=[host])  # the rerun finishes the job
    assert rc in (0, 1), (report, err[-3000:])
    assert f"{host}: resuming rollout {marker['rollout_id']} ({after})" in err, err[-3000:]
    result = report["hosts"][host]["result"]
    assert result in ("upgraded", "rolled back"), report
    current = agree(th, host)
    assert current["version"] == (NEWER if result == "upgraded" else "b9785")
    assert health(th, host) == "200"
    assert not th(host).file(f"{ROOT}/state/rollout.json").exists  # finished


def read_marker(th, host: str) -> dict | None:
    f = th(host).file(f"{ROOT}/state/rollout.json")
    return json.loads(f.content_string) if f.exists else None


def wait_for_marker(th, host: str, phase: str) -> dict:
    deadline = time.monotonic() + 120
    while True:
        got = read_marker(th, host)
        if got and got["phase"] == phase:
            return got
        assert time.monotonic() < deadline, f"no {phase} marker on {host}: {got}"
        time.sleep(0.2)


def test_rollback_by_hand_then_converge_returns_to_the_data(llama_fleet, th):
    host = LLAMAS[0]
    rc, _, err = rollout(NO_GATE, *newer(), limit=[host])
    assert rc == 0, err[-3000:]
    out = subprocess.run(
        [*CLI, "rollback", INVENTORY, "--limit", host, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["hosts"][host]["result"] == "rolled back"
    assert json.loads(out.stdout)["exit_code"] == 0  # the report says what the process exits
    assert agree(th, host)["version"] == "b9785" and health(th, host) == "200"
    # A second rollback has nothing to go back to: the healthy host is untouched, not broken.
    again = subprocess.run(
        [*CLI, "rollback", INVENTORY, "--limit", host, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    second = json.loads(again.stdout)["hosts"][host]
    assert again.returncode == 1 and second["result"] == "untouched", again.stdout + again.stderr
    assert second["detail"].startswith("no previous release to go back to; serving llama.cpp b9785")
    assert agree(th, host)["version"] == "b9785" and health(th, host) == "200"
    status = json.loads(
        subprocess.run(
            [*CLI, "status", INVENTORY, "--limit", host, "--json"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert status["hosts"][host]["rolled_back_from"].startswith(f"llama.cpp {NEWER}")
    run = pyinfra(
        INVENTORY, Q4, limit=host, data={"llamacpp_tag": NEWER, "llamacpp_commit": commits()[NEWER]}
    )
    assert run.returncode == 0, run.output[-3000:]
    current = agree(th, host)
    assert current["version"] == NEWER and records(th, host)["rolled_back_from"] is None
    # A rollout that asks for the release the host serves changes nothing, and says so.
    rc, report, err = rollout(NO_GATE, *newer(), limit=[host])
    assert rc == 0 and report["hosts"][host]["result"] == "unchanged", (report, err[-2000:])
    assert "benching" not in err  # the gate is off: nothing is benched
    assert agree(th, host) == current


def test_a_rollback_into_a_unit_its_sandbox_refuses_is_stopped_by_the_probe(llama_fleet, th):
    """A rollback restarts into the recorded unit only after that unit's own sandbox ran its
    probe: a previous release whose unit the engine cannot live with (a system-call filter
    without file access) fails the host in one line, and the unit on disk and the running
    server are the ones from before."""
    host, h = LLAMAS[0], th(LLAMAS[0])
    path = f"{ROOT}/state/releases.json"
    saved = h.file(path).content_string
    doc = json.loads(saved)
    previous = doc["previous"][0]
    assert previous["probe_argv"]  # recorded with the release: the probe the converge ran
    shipped = "SystemCallFilter=@system-service\n"
    assert shipped in previous["unit_text"]
    previous["unit_text"] = previous["unit_text"].replace(
        shipped, shipped + "SystemCallFilter=~@file-system\n"
    )
    unit, pid = h.file(UNIT).content_string, h.process.get(comm="llama-server").pid

    def put(text: str) -> None:
        assert h.run(f"printf %s {shlex.quote(text)} > {path}").rc == 0

    put(json.dumps(doc))
    try:
        out = subprocess.run(
            [*CLI, "rollback", INVENTORY, "--limit", host, "--json"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode != 0, out.stdout + out.stderr
        detail = json.loads(out.stdout)["hosts"][host]["detail"]
        assert "the sandbox probe" in detail and "SystemCallFilter=" in detail, detail
        assert h.file(UNIT).content_string == unit  # the unit was not replaced
        assert h.process.get(comm="llama-server").pid == pid and health(th, host) == "200"
        assert json.loads(h.file(path).content_string) == doc  # the records untouched
    finally:
        put(saved)


@pytest.fixture(scope="module")
def vllm_026(testbed):
    """vLLM 0.26.0's real wheel in the wheelhouse, beside 0.24.0's."""
    material.prepare(rtx4090=False)
    wheel = vllm_wheel("0.26.0")
    house = shared_dir() / "wheels" / wheel.name
    if not house.exists():
        os.link(wheel, house)
    run = pyinfra(INVENTORY, BF16, limit="spark-1", timeout=3600)
    assert run.returncode == 0, run.output[-3000:]
    yield
    pyinfra(INVENTORY, BF16, limit="spark-1", timeout=3600)


# 0.26.0 as recorded on the H200 (tests/fixtures/h200/vllm/0.26.0_patched_flag.vllm.log): served
# as "tiny", with --enforce-eager. The stand-in replays a recording only for the argv it was made
# with, so the release asks for exactly that.
V026 = [
    "--data",
    "vllm_version=0.26.0",
    "--data",
    "served_model_name=tiny",
    "--data",
    'vllm_extra_args=["--enforce-eager"]',
]


def test_vllm_0_24_to_0_26_upgrades_then_rolls_back_when_0_26_fails(vllm_026, th):
    host, unit = "spark-1", "/etc/systemd/system/servefleet-vllm.service"
    rc, report, err = rollout(*V026, deploy=BF16, limit=[host])
    assert rc == 0, failed(report, err)
    assert report["hosts"][host]["result"] == "upgraded"
    # The stand-in's speed means nothing: no performance gate for these hosts (testbed data).
    assert report["hosts"][host]["perf"] == "off (perf_gate = false in this host's data)"
    assert report["hosts"][host]["perf_before"] is None
    current = agree(th, host, unit)
    assert current["version"] == "0.26.0" and current["prefix"].endswith("/vllm-0.26.0")
    journal = th(host).check_output("journalctl -u servefleet-vllm -o cat --no-pager -n 400")
    assert "Initializing a V1 LLM engine (v0.26.0)" in journal  # 0.26.0's own recorded lines
    assert "--enforce-eager" in current["unit_text"] and "'enforce_eager': True" in journal
    # Both venvs are kept: 0.24.0 can serve again without installing anything.
    assert th(host).file(f"{ROOT}/venvs/vllm-0.24.0/bin/python").exists

    rc, _, err = rollout(deploy=BF16, limit=[host])  # back to 0.24.0, the data's release
    assert rc == 0, err[-3000:]
    th(host).run(
        "mkdir -p /etc/servefleet-standin && echo 0.26.0 > /etc/servefleet-standin/fail-versions"
    )
    try:
        rc, report, err = rollout(*V026, deploy=BF16, limit=[host])
    finally:
        th(host).run("rm -f /etc/servefleet-standin/fail-versions")
    assert rc == 1, failed(report, err)
    assert report["hosts"][host]["result"] == "rolled back", report
    assert "crash-looping" in report["hosts"][host]["detail"]
    current = agree(th, host, unit)
    assert current["version"] == "0.24.0"
    assert health(th, host, 8000) == "200"
