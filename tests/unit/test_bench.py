"""The node-side benchmark script against a real llama-server (CPU host build, tiny GGUF)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from servefleet.core.lint.gguf_lint import lint_gguf, override_kv_flag
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


def bench(port: int, cgroup: Path) -> dict:
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
    in a cgroup of its own, benched as it is and beside three busy loops at the same priority
    on this machine's cores. The busy loops really slow it down; the figures without the waits
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
        alone = bench(server.port, cg)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
        busy = bench(server.port, cg)
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
