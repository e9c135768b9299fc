"""Upstream bytes and wall time of putting one model on N nodes: every node from the hub, or once
through the depot (deploys/depot.py, then nodes with model_source = "depot").

Runs on the testbed ($SERVEFLEET_TESTBED_INSTANCE picks which): brings up depot-1 and spark-1..N
when they are not up, publishes a synthetic model (random shards, --size-mb in all) to the testbed's
hub, provisions every host once with a tiny model (base, tools, depot access: not measured), then
for each source and N: deletes the model from the hosts, zeroes the hub's counters, runs the
deploys with the real pyinfra CLI, and reads the body bytes the hub served ("upstream bytes").

    SERVEFLEET_TESTBED_INSTANCE=2 python benchmarks/depot_fanout.py [--size-mb 256] [--nodes 1,3]

Leaves the testbed up (take it down with `servefleet testbed down`); deletes the model from the
hosts and the hub's store afterwards unless --keep.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from servefleet.core.paths import cache_subdir
from servefleet_dev import hub
from servefleet_dev.testbed import hosts as tb_hosts, lifecycle
from servefleet_dev.testbed.services import hub_root
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import pyinfra
from servefleet_dev.testing.tiny_models import build_tiny_checkpoint

REPO, WARMUP = "bench/depot-fanout", "bench/depot-fanout-warmup"
DEPOT, STORE = "depot-1", "/opt/servefleet/depot"
DEST = "/opt/servefleet/models/bench-fanout"
MB = 1_000_000


def make_model(directory: Path, size: int) -> Path:
    """config.json + two random shards (nothing compresses, nothing dedups across shards)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "bench", "size": size}) + "\n")
    for k in (1, 2):
        left = size // 2
        with open(directory / f"model-0000{k}-of-00002.safetensors", "wb") as f:
            while left:
                left -= f.write(os.urandom(min(left, 16 << 20)))
    return directory


def ssh(name: str, command: str) -> None:
    address = load_state().hosts[name].address
    subprocess.run(
        [*tb_hosts.ssh_base_args(), f"root@{address}", command], check=True, capture_output=True
    )


def deploy_depot(repo: str) -> float:
    models = json.dumps([{"repo_id": repo, "revision": "main", "include": ["*"]}])
    began = time.monotonic()
    run = pyinfra(
        "inventory/testbed.py",
        "deploys/depot.py",
        limit=DEPOT,
        data={"depot_models": models},
        timeout=1800,
    )
    if run.returncode != 0:
        raise SystemExit(f"deploys/depot.py failed:\n{run.output[-3000:]}")
    return time.monotonic() - began


def deploy_nodes(nodes: list[str], repo: str, source: str) -> float:
    data = {
        "model_repo": repo,
        "model_revision": "main",
        "model_include": '["*"]',
        "model_dir": DEST,
        "model_source": source,
    }
    if source == "depot":
        data["depot_host"] = DEPOT
    began = time.monotonic()
    run = pyinfra(
        "inventory/testbed.py", "deploys/model.py", limit=",".join(nodes), data=data, timeout=1800
    )
    if run.returncode != 0:
        raise SystemExit(f"deploys/model.py ({source}) failed:\n{run.output[-3000:]}")
    return time.monotonic() - began


def clean(nodes: list[str], repo: str) -> None:
    for name in nodes:
        ssh(name, f"rm -rf {DEST}")
    ssh(DEPOT, f"rm -rf {STORE}/{repo}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=256, help="model size in MB (default 256)")
    parser.add_argument("--nodes", default="1,3", help="fleet sizes to measure (default 1,3)")
    parser.add_argument("--keep", action="store_true", help="keep the model on hosts and hub")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    all_nodes = [f"spark-{i}" for i in range(1, max(counts) + 1)]

    lifecycle.up([DEPOT, *all_nodes], log=lambda m: print(f"[testbed] {m}", file=sys.stderr))
    url = load_state().services["hub"]["url"]
    hub.clear_faults(url)

    work = cache_subdir("bench") / "depot-fanout"
    src = make_model(work / "model", args.size_mb * MB)
    sha = hub.publish(hub_root(), REPO, src, link=True)
    size = sum(p.stat().st_size for p in src.iterdir())
    if not (work / "warmup").exists():
        build_tiny_checkpoint(work / "warmup")
    hub.publish(hub_root(), WARMUP, work / "warmup")
    print(f"model {REPO}@{sha[:12]}: {size / MB:.1f} MB, hub {url}", file=sys.stderr)

    # Provision every host once (base, tools, depot account and access): not measured.
    deploy_depot(WARMUP)
    deploy_nodes(all_nodes, WARMUP, "depot")

    rows = []
    try:
        for source in ("hub", "depot"):
            for n in counts:
                nodes = all_nodes[:n]
                clean(all_nodes, REPO)
                hub.hub_stats(url, reset=True)
                t_depot = deploy_depot(REPO) if source == "depot" else 0.0
                t_nodes = deploy_nodes(nodes, REPO, source)
                upstream = hub.hub_stats(url)["total_bytes"]
                rows.append((source, n, upstream, t_depot, t_nodes))
                print(
                    f"{source} N={n}: {upstream / MB:.1f} MB upstream, {t_depot + t_nodes:.1f} s",
                    file=sys.stderr,
                )
    finally:
        if not args.keep:
            clean(all_nodes, REPO)
            shutil.rmtree(hub.repo_dir(hub_root(), REPO), ignore_errors=True)
            shutil.rmtree(work / "model", ignore_errors=True)

    print(
        f"\nModel: {size / MB:.1f} MB ({REPO}@{sha[:12]}); upstream = body bytes the hub served; "
        "wall = pyinfra runs (incl. ~5 s of pyinfra/SSH overhead each)"
    )
    print(
        f"{'source':<7} {'N':>2} {'upstream MB':>12} {'copies':>7} {'depot s':>8} "
        f"{'nodes s':>8} {'wall s':>7}"
    )
    for source, n, upstream, t_depot, t_nodes in rows:
        print(
            f"{source:<7} {n:>2} {upstream / MB:>12.1f} {upstream / size:>7.2f} "
            f"{t_depot:>8.1f} {t_nodes:>8.1f} {t_depot + t_nodes:>7.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
