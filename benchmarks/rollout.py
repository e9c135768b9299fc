"""A llama.cpp rollout of 5 testbed hosts in batches of 2: wall time, per-host gate time, and the
time to roll back one failed host.

Run: .venv/bin/python benchmarks/rollout.py [--hosts 5] [--batch 2]

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set). The hosts first serve
b9785 (the testbed's pin; converged once, not timed; the shared ccache makes the builds after the
first cheap). Then, timed:
  1. upgrade: `servefleet rollout --batch 2` to the patch release b9785-patch1 (a later commit);
  2. back to b9785 (the data's release), not reported;
  3. failing upgrade: the newer tree with the GGUF overrides turned off, which cannot load the
     field GGUF; the first host fails its gate, is rolled back, and the rollout stops.
Printed: wall time of each rollout, each host's converge and gate seconds, what the performance
gate added to each host (perf s: the baseline bench before its converge and the bench after its
health gate, SSH included, with its verdict), and the rollback time of the failed host, as the
rollout's own JSON report gives them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from servefleet_dev.testbed import lifecycle, material  # noqa: E402
from servefleet_dev.testing.llama_src import commits  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra  # noqa: E402

INVENTORY, Q4 = "inventory/testbed.py", "deploys/serve_q4_llamacpp.py"
NEWER = "b9785-patch1"


def rollout(hosts: list[str], batch: int, *data: str) -> tuple[float, int, dict]:
    cmd = [
        sys.executable,
        "-m",
        "servefleet.cli",
        "rollout",
        INVENTORY,
        Q4,
        "--json",
        "--batch",
        str(batch),
    ]
    for name in hosts:
        cmd += ["--limit", name]
    for item in data:
        cmd += ["--data", item]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=7200)
    wall = time.monotonic() - t0
    report = json.loads(out.stdout) if out.stdout.strip() else {"hosts": {}, "stderr": out.stderr}
    return wall, out.returncode, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    quiet = lambda m: None  # noqa: E731
    hosts = [f"rtx4090-{i}" for i in range(1, args.hosts + 1)]
    newer = [f"llamacpp_tag={NEWER}", f"llamacpp_commit={commits()[NEWER]}"]
    try:
        lifecycle.down(log=quiet)
        lifecycle.up(hosts, log=quiet)
        material.prepare(spark=False)
        first = pyinfra(INVENTORY, Q4, timeout=7200)
        assert first.returncode == 0, first.output[-3000:]
        up_wall, up_rc, up = rollout(hosts, args.batch, *newer)
        assert up_rc == 0, up
        back_wall, back_rc, back = rollout(hosts, args.batch)
        assert back_rc == 0, back
        fail_wall, fail_rc, fail = rollout(
            hosts, args.batch, *newer, "llamacpp_gguf_overrides=false"
        )
        assert fail_rc == 1, fail
    finally:
        lifecycle.down(log=quiet)

    table = Table(
        title=f"llama.cpp rollout, {args.hosts} testbed hosts, batches of {args.batch} "
        f"(b9785 -> {NEWER}; {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')})"
    )
    for col in (
        "host",
        "upgrade: converge s",
        "upgrade: gate s",
        "upgrade: perf s",
        "failing: result",
        "failing: gate s",
        "failing: rollback s",
    ):
        table.add_column(col, justify="right")
    for name in hosts:
        u, f = up["hosts"].get(name, {}), fail["hosts"].get(name, {})
        table.add_row(
            name,
            str(u.get("converge_s")),
            str(u.get("gate_s")),
            str(u.get("perf_s")),
            str(f.get("result")),
            str(f.get("gate_s")),
            str(f.get("rollback_s")),
        )
    Console().print(table)
    gates = [h["gate_s"] for h in up["hosts"].values() if h.get("gate_s") is not None]
    rolled = [h["rollback_s"] for h in fail["hosts"].values() if h.get("rollback_s") is not None]
    print(
        f"upgrade rollout wall time: {up_wall:.1f} s (back to b9785: {back_wall:.1f} s); "
        f"median per-host gate: {statistics.median(gates):.1f} s"
    )
    perf = [
        h["perf_s"] for r in (up, back) for h in r["hosts"].values() if h.get("perf_s") is not None
    ]
    if perf:
        print(
            f"performance gate per host (baseline + check, both rollouts): median "
            f"{statistics.median(perf):.1f} s ({min(perf):.1f}-{max(perf):.1f}, {len(perf)} hosts)"
        )
    for name, h in up["hosts"].items():
        print(f"  {name}: {h.get('perf')}")
    print(
        f"failing rollout wall time: {fail_wall:.1f} s; rollback of the failed host: "
        f"{', '.join(f'{s:.1f} s' for s in rolled) or 'none'}"
    )


if __name__ == "__main__":
    main()
