"""The node-side benchmark script against a real llama-server (CPU host build, tiny GGUF)."""

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from servefleet.cli import main
from servefleet.core.lint.gguf_lint import lint_gguf, override_kv_flag
from servefleet.verbs import bench
from servefleet.verbs.bench import SCRIPT, roofline
from servefleet_dev.testing.llama_build import llama_host_build
from servefleet_dev.testing.tiny_models import GGUF_CLEAN, GGUF_FIELD_MISSING_MTP, build_tiny_gguf


def test_roofline_matches_the_field_report():
    # DGX Spark: 273 GB/s, ~3B active params x 2 bytes (BF16) -> 45.5 tok/s; 30.4 tok/s = 0.67.
    top = roofline(273e9, 3e9 * 2)
    assert round(top, 1) == 45.5 and round(30.4 / top, 2) == 0.67
    assert roofline(None, 6e9) is None


def test_stream_bench_measures_a_real_llama_server(tmp_path):
    from tests.unit.test_gguf_server import Server

    model = build_tiny_gguf(tmp_path / "m.gguf", layout=GGUF_CLEAN)
    server = Server(llama_host_build(), model, tmp_path / "server.log", ("-c", "2048"))
    try:
        assert server.healthy, server.log()
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve().parents[2] / SCRIPT),
                "--url",
                f"http://127.0.0.1:{server.port}",
                "--runs",
                "3",
                "--prompt-tokens",
                "200",
                "--max-tokens",
                "32",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["runs"]) == 3
    for run in result["runs"]:
        # ignore_eos: every request decodes exactly max_tokens; usage came with the stream
        assert run["completion_tokens"] == 32
        assert run["ttft_s"] > 0 and run["decode_tok_s"] > 0
    # the prompt was sized with the server's own tokenizer, plus the chat template around it
    assert 200 <= result["prompt_tokens"] < 400
    assert result["median_decode_tok_s"] == sorted(r["decode_tok_s"] for r in result["runs"])[1]


def cgroup2() -> Path:
    """This machine's cgroup2 mount (/sys/fs/cgroup, or /sys/fs/cgroup/unified when hybrid)."""
    with open("/proc/self/mounts") as mounts:
        found = [line.split()[1] for line in mounts if line.split()[2] == "cgroup2"]
    assert found, "no cgroup2 mounted: the CPU waits need PSI on a unified hierarchy"
    return Path(found[0])


def bench_with_waits(port: int, cgroup: Path) -> dict:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[2] / SCRIPT), "--url",
         f"http://127.0.0.1:{port}", "--runs", "5", "--prompt-tokens", "256", "--max-tokens",
         "128", "--cgroup", str(cgroup)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_cpu_the_engine_waited_for_is_measured_and_taken_out(tmp_path):
    """The performance gate's figures without the engine's CPU waits (PSI, `full`): a server
    in a cgroup of its own, benched alone on one CPU, then with three busy loops at the same
    priority pinned to that CPU (so they contend however many cores the machine has and whatever
    else runs on them). The busy loops really slow it down; the figures without the waits
    leave out the time the kernel saw the engine wait for a CPU: a good part of the slowdown
    (what remains is what busy cores cost a running thread: shared caches, an SMT sibling)."""
    from tests.unit.test_gguf_server import Server

    cg = cgroup2() / f"servefleet-test-bench-{os.getpid()}"
    cg.mkdir()
    # The testbed's model and server: 40 blocks on one thread, ~1 ms a token.
    model = build_tiny_gguf(tmp_path / "m.gguf", layout=GGUF_FIELD_MISSING_MTP)
    fix = override_kv_flag(lint_gguf(model))
    args = ("-c", "2048", "-t", "1", "--override-kv", fix)
    server = Server(llama_host_build(), model, tmp_path / "server.log", args)
    hogs = []
    try:
        assert server.healthy, server.log()
        (cg / "cgroup.procs").write_text(str(server.proc.pid))
        cpu = {max(os.sched_getaffinity(0))}
        for thread in Path(f"/proc/{server.proc.pid}/task").iterdir():
            os.sched_setaffinity(int(thread.name), cpu)
        alone = bench_with_waits(server.port, cg)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
        for hog in hogs:
            os.sched_setaffinity(hog.pid, cpu)
        busy = bench_with_waits(server.port, cg)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        server.stop()
        cg.rmdir()
    for run in alone["runs"] + busy["runs"]:
        prefill, decode = run["cpu_wait_s"]
        assert 0 <= prefill <= run["ttft_s"] and run["own_ttft_s"] <= run["ttft_s"]
        assert run["own_decode_tok_s"] >= run["decode_tok_s"]

    def wall(result):  # seconds of prefill and decode, all runs
        return sum(r["ttft_s"] + 127 / r["decode_tok_s"] for r in result["runs"])

    def waits(result):
        return sum(sum(r["cpu_wait_s"]) for r in result["runs"])

    added = wall(busy) - wall(alone)
    assert added > 0.5 * wall(alone), (alone, busy)  # the loops took the CPU from the server
    # ... and a good part of the time they added is the engine waiting for a CPU, as the
    # kernel counts it: the part the gate's figures leave out.
    assert waits(busy) - waits(alone) > 0.25 * added, (alone, busy)


# --- a whole inventory: the depot is skipped; the testbed has no roofline (#30) -----------------

SERVING = {
    "servefleet_root": "/opt/servefleet",
    "service_host": "127.0.0.1",
    "service_port": 8000,
    "memory_bandwidth_bytes_per_s": 273 * 10**9,  # group_data/spark.py: the GB10's
    "bytes_per_token": 3 * 10**9 * 2,
}
MEASURED = {
    "runs": [{"ttft_s": 0.05, "decode_tok_s": 451.4}],
    "median_ttft_s": 0.05,
    "median_decode_tok_s": 451.4,  # what the vLLM stand-in does on a CPU: 9.92x the GB10's
    "prompt_tokens": 300,
}


def fake_host(name: str, groups: list[str], **data):
    return SimpleNamespace(
        name=name, groups=groups, state=None, data=SimpleNamespace(dict=lambda: {**SERVING, **data})
    )


class FakeSession:
    """servefleet.verbs.session.Session's surface bench() uses: the hosts, all reached."""

    def __init__(self, hosts):
        self.targets, self.unreachable = hosts, {}

    def each(self, func, hosts=None):
        return {h.name: func(h) for h in self.targets if hosts is None or h in hosts}


@pytest.fixture
def fleet(monkeypatch, capsys):
    """Runs the real `servefleet bench` on fake hosts; the node-side bench answers with
    MEASURED on a serving host, and is refused on a depot, as a depot's port is."""
    hosts = []

    @contextmanager
    def session(inventory, limit=None):
        yield FakeSession(hosts)

    def node(host, command):
        if "depot" in host.groups:
            return (
                False,
                "",
                "curl: (7) Failed to connect to 127.0.0.1 port 8000: Connection refused",
            )
        return True, json.dumps(MEASURED), ""

    monkeypatch.setattr(bench.api, "session", session)
    monkeypatch.setattr(bench, "put", lambda *a, **kw: True)
    monkeypatch.setattr(bench, "run", node)
    monkeypatch.setattr(bench, "python", lambda: "python3")
    monkeypatch.setenv("COLUMNS", "80")

    def run(*args):
        code = main(["bench", "inventory/fleet.py", *args])
        return code, capsys.readouterr().out

    return hosts, run


def test_bench_of_a_whole_inventory_skips_the_depot_and_says_so(fleet):
    hosts, run = fleet
    hosts += [fake_host("depot-1", ["depot"]), fake_host("spark-1", ["spark"])]
    code, out = run()
    assert code == 0, out  # was: exit 1, the depot "failed: ... Connection refused"
    assert "depot-1: skipped: no serving engine (role depot)" in out
    assert "failed" not in out
    code, out = run("--json")
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0
    assert doc["summary"] == {"hosts": 2, "ok": 1, "failed": 0, "unreachable": 0, "skipped": 1}
    assert doc["hosts"]["depot-1"]["skipped"].startswith("no serving engine")
    assert doc["hosts"]["spark-1"]["ok"]


def test_a_testbed_host_has_no_roofline_ratio_and_the_row_says_why(fleet):
    hosts, run = fleet
    hosts += [
        fake_host(
            "spark-1",
            ["spark", "vllm", "testbed_vllm", "testbed"],
            vllm_executable="/var/cache/servefleet/standin/vllm-standin",
        ),
        fake_host("spark-2", ["spark"]),
    ]
    code, out = run()
    assert code == 0, out
    rows = {line.split()[0]: line for line in out.splitlines()[2:4]}
    assert "9.92" not in rows["spark-1"] and "n/a (below)" in rows["spark-1"], out
    assert rows["spark-2"].split()[4:6] == ["45.5", "9.92"]  # a real Spark: the ratio stands
    assert "spark-1: no roofline ratio: testbed: the engine stand-in" in out
    doc = json.loads(run("--json")[1])
    node = doc["hosts"]["spark-1"]
    assert node["roofline_tok_s"] is None and node["roofline_ratio"] is None
    assert node["roofline_note"].startswith("testbed: the engine stand-in")
