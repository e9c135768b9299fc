"""Cold build time and no-change rerun time of deploys/serve_q4_llamacpp.py on the testbed.

    SERVEFLEET_TESTBED_INSTANCE=3 python benchmarks/llamacpp_deploy.py [--runs 3] [--keep]

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=8 unless set) with one rtx4090 host
(CPU build, tiny missing-MTP GGUF from the testbed hub). Steps, each timed:

1. converge once so that everything but the build is in place (not timed as "cold");
2. cold: the installed build removed, ccache emptied (a fresh, empty CCACHE_DIR in a temp dir of
   the shared cache, so the fleet's warm ccache is left alone), converge: clone/fetch, configure,
   compile, install, switch, restart, /health, smoke test;
3. no-change reruns: converge again, zero changes expected;
4. warm: the installed build removed again, the same (now warm) ccache: what a rebuild costs.

Prints wall seconds of each converge, the build's own seconds (build.json), and ccache stats.
The machine has 2 cores shared with other work: numbers vary with load.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "8")

from servefleet.engines.llamacpp import logic as llamacpp  # noqa: E402
from servefleet_dev.hub import publish  # noqa: E402
from servefleet_dev.testbed import (
    hosts as tb_hosts,
    lifecycle,
)
from servefleet_dev.testbed.services import hub_root  # noqa: E402
from servefleet_dev.testbed.state import load_state  # noqa: E402
from servefleet_dev.testing.llama_src import commits  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import pyinfra  # noqa: E402
from servefleet_dev.testing.tiny_models import build_tiny_gguf  # noqa: E402

HOST = "rtx4090-1"
DEPLOY = "deploys/serve_q4_llamacpp.py"
ROOT = Path(__file__).resolve().parents[1]
GUEST_CACHE = tb_hosts.GUEST_CACHE


def testbed_data() -> dict:
    import runpy

    data = {}
    for name in ("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed"):
        data.update(
            {
                k: v
                for k, v in runpy.run_path(str(ROOT / "group_data" / f"{name}.py")).items()
                if not k.startswith("__")
            }
        )
    return data


def ssh(cmd: str) -> str:
    address = load_state().hosts[HOST].address
    out = subprocess.run(
        [*tb_hosts.ssh_base_args(), f"root@{address}", cmd], capture_output=True, text=True
    )
    return out.stdout.strip()


def converge(env: dict, **data) -> tuple[float, object]:
    t0 = time.monotonic()
    run = pyinfra("inventory/testbed.py", DEPLOY, limit=HOST, data={**env, **data}, timeout=3600)
    took = time.monotonic() - t0
    assert run.returncode == 0, run.output[-4000:]
    return took, run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="no-change reruns")
    ap.add_argument("--keep", action="store_true", help="leave the testbed up afterwards")
    args = ap.parse_args()
    data = testbed_data()
    name = llamacpp.build_name(data)
    prefix = f"{data['servefleet_root']}/llama.cpp/{name}"

    was_up = HOST in load_state().hosts
    lifecycle.up([HOST], log=lambda m: None)
    tmp = Path(tempfile.mkdtemp(prefix="ccache-bench-", dir=tb_hosts.shared_dir()))
    guest_ccache = f"{GUEST_CACHE}/{tmp.name}"
    try:
        assert commits()[data["llamacpp_tag"]] == data["llamacpp_commit"], "update the testbed data"
        with tempfile.TemporaryDirectory() as src:
            build_tiny_gguf(Path(src) / data["model_file"], layout="missing_mtp")
            publish(hub_root(), data["model_repo"], src)
        env = {"hf_endpoint": load_state().services["hub"]["url"]}

        setup, _ = converge(env)
        print(f"setup converge (packages, model, first build if any): {setup:.1f} s")

        ssh(f"rm -rf {prefix}")
        cold, run = converge(env, llamacpp_ccache_dir=guest_ccache)
        cold_build = json.loads(ssh(f"cat {prefix}/build.json"))["build_seconds"]
        stats_cold = ssh(f"CCACHE_DIR={guest_ccache} ccache -s | head -6")
        print(
            f"cold converge (empty ccache): {cold:.1f} s, of which build {cold_build} s; "
            f"{run.changed} operations changed"
        )

        reruns = []
        for _ in range(args.runs):
            took, run = converge(env, llamacpp_ccache_dir=guest_ccache)
            assert run.changed == 0, (
                f"rerun changed {run.changed} operations:\n{run.output[-3000:]}"
            )
            reruns.append(took)
        print(
            f"no-change rerun: median {statistics.median(reruns):.1f} s "
            f"(min {min(reruns):.1f}, max {max(reruns):.1f}, {args.runs} runs), 0 changes"
        )

        ssh(f"CCACHE_DIR={guest_ccache} ccache -z >/dev/null; rm -rf {prefix}")
        warm, run = converge(env, llamacpp_ccache_dir=guest_ccache)
        warm_build = json.loads(ssh(f"cat {prefix}/build.json"))["build_seconds"]
        stats_warm = ssh(f"CCACHE_DIR={guest_ccache} ccache -s | head -6")
        print(f"warm-ccache rebuild converge: {warm:.1f} s, of which build {warm_build} s")
        print("\n| step | converge wall s | build s |\n|---|---|---|")
        print(f"| cold build (empty ccache) | {cold:.1f} | {cold_build} |")
        print(f"| no-change rerun (median of {args.runs}) | {statistics.median(reruns):.1f} | - |")
        print(f"| rebuild, warm ccache | {warm:.1f} | {warm_build} |")
        print(
            f"\nccache after the cold build:\n{stats_cold}\nccache of the warm rebuild:\n{stats_warm}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not was_up and not args.keep:
            lifecycle.down(log=lambda m: None)


if __name__ == "__main__":
    main()
