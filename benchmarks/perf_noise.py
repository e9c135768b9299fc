"""Run-to-run noise of the rollout's performance gate on the testbed, and what a real slowdown
looks like through it.

    SERVEFLEET_TESTBED_INSTANCE=3 .venv/bin/python benchmarks/perf_noise.py [--repeats 10]
        [--slow '["--threads", "1", "--ubatch-size", "1"]'] [--keep]

One rtx4090 host (the real llama-server, CPU build, the tiny GGUF) serving b9785. The gate's
measurement (`servefleet bench` with the gate's workload from group_data: perf_gate_runs,
perf_gate_prompt_tokens, perf_gate_max_tokens) is repeated --repeats times, one after another,
as the gate would take it. Printed: each measurement's median decode tok/s and TTFT, their
coefficient of variation (sample standard deviation / mean: the spread the gate's thresholds
must stand), the largest drop and rise between any two measurements, then the same with the
server arguments of --slow (a release made genuinely slower) and with the newer tree (the e2e
upgrade, which must be as fast), and the change the gate would see for each.
Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set); brought down at the end
unless --keep. Each measurement holds the machine alone (servefleet_dev.testing.quiet), as the
e2e tests of the gate do; a test session running meanwhile pauses between its tests.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from servefleet.core import perf  # noqa: E402
from servefleet.core.groupdata import load_group  # noqa: E402
from servefleet_dev.testbed import lifecycle, material  # noqa: E402
from servefleet_dev.testing import quiet as quiet_machine  # noqa: E402
from servefleet_dev.testing.llama_src import commits  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra  # noqa: E402

INVENTORY, Q4, HOST = "inventory/testbed.py", "deploys/serve_q4_llamacpp.py", "rtx4090-1"
NEWER = "llama-cpp-python-0.3.36"


def workload() -> perf.Workload:
    data = {**load_group("all"), **load_group("rtx4090"), **load_group("testbed_rtx4090")}
    return perf.Settings.of(data).workload


def measure(w: perf.Workload) -> tuple[float, float, float]:
    """(median decode tok/s, median TTFT s, seconds) of one gate measurement."""
    t0 = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "servefleet.cli",
            "bench",
            INVENTORY,
            "--limit",
            HOST,
            "--runs",
            str(w.runs),
            "--prompt-tokens",
            str(w.prompt_tokens),
            "--max-tokens",
            str(w.max_tokens),
            "--json",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    (node,) = json.loads(out.stdout)
    return node["median_decode_tok_s"], node["median_ttft_s"], took


def series(w: perf.Workload, repeats: int, label: str) -> list[tuple[float, float, float]]:
    got = []
    for i in range(repeats):
        with quiet_machine.exclusive():  # as the e2e gate tests measure: nothing else running
            got.append(measure(w))
        print(
            f"  {label} {i + 1}/{repeats}: {got[-1][0]:.1f} tok/s, TTFT {got[-1][1]:.3f} s "
            f"({got[-1][2]:.1f} s)",
            flush=True,
        )
    decode, ttft = [g[0] for g in got], [g[1] for g in got]
    print(
        f"{label}: decode median {statistics.median(decode):.1f} tok/s, CV "
        f"{perf.cv_pct(decode):.1f} %, range {min(decode):.1f}-{max(decode):.1f} "
        f"(largest drop between two measurements {(1 - min(decode) / max(decode)) * 100:.1f} %); "
        f"TTFT median {statistics.median(ttft):.3f} s, CV {perf.cv_pct(ttft):.1f} %, range "
        f"{min(ttft):.3f}-{max(ttft):.3f} (largest rise {(max(ttft) / min(ttft) - 1) * 100:.1f} "
        f"%); one measurement {statistics.median(g[2] for g in got):.1f} s (median, with SSH)",
        flush=True,
    )
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--slow",
        default='["--threads", "1", "--ubatch-size", "1"]',
        help="llamacpp_server_args (JSON)",
    )
    ap.add_argument("--slow-repeats", type=int, default=5)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    quiet = lambda m: None  # noqa: E731
    w = workload()
    print(
        f"gate workload: {w.runs} runs (+1 warm-up), {w.prompt_tokens} prompt tokens, "
        f"{w.max_tokens} max tokens; {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    )
    try:
        lifecycle.down(log=quiet)
        lifecycle.up([HOST], log=quiet)
        material.prepare(spark=False, log=quiet)
        run = pyinfra(INVENTORY, Q4, limit=HOST, timeout=3600)
        assert run.returncode == 0, run.output[-3000:]
        fast = series(w, args.repeats, "b9785")
        run = pyinfra(
            INVENTORY, Q4, limit=HOST, timeout=3600, data={"llamacpp_server_args": args.slow}
        )
        assert run.returncode == 0, run.output[-3000:]
        slow = series(w, args.slow_repeats, f"b9785 {args.slow}")
        run = pyinfra(
            INVENTORY,
            Q4,
            limit=HOST,
            timeout=3600,
            data={"llamacpp_tag": NEWER, "llamacpp_commit": commits()[NEWER]},
        )
        assert run.returncode == 0, run.output[-3000:]
        newer = series(w, args.slow_repeats, NEWER)
    finally:
        if not args.keep:
            lifecycle.down(log=quiet)
    fd, ft = statistics.median(g[0] for g in fast), statistics.median(g[1] for g in fast)
    for label, got in ((f"slower release ({args.slow})", slow), (NEWER, newer)):
        sd, st = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
        print(
            f"{label}: decode {fd:.1f} -> {sd:.1f} tok/s ({perf.change_pct(fd, sd):+.1f} %), "
            f"TTFT {ft:.3f} -> {st:.3f} s ({perf.change_pct(ft, st):+.1f} %)"
        )


if __name__ == "__main__":
    main()
