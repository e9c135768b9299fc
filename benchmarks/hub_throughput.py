"""Throughput of the local hub (servefleet_dev.hub) with the real huggingface_hub client over loopback.

Creates a 1 GB file in a temporary directory under the servefleet cache (never in the repo),
publishes it, serves it from a separate `python -m servefleet_dev.hub serve` process, downloads it with
`hf_hub_download` N times into fresh caches, and prints seconds, MB/s, the median, the bytes the server
sent ("upstream bytes") and the server's peak RSS (sendfile: it must stay far below the file size).

    python benchmarks/hub_throughput.py [--size-mb 1024] [--runs 3] [--sparse]
"""

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# huggingface_hub reads these once, at import.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")

from huggingface_hub import hf_hub_download  # noqa: E402

from servefleet.core.paths import cache_subdir  # noqa: E402
from servefleet_dev import hub  # noqa: E402

REPO, FILENAME = "bench/one-gig", "model.safetensors"
MB = 1_000_000


def make_file(path: Path, size: int, sparse: bool) -> None:
    """Random content by default (a 16 MiB random block repeated: cheap, and nothing compresses it)."""
    with open(path, "wb") as f:
        if sparse:
            f.truncate(size)
            return
        block = os.urandom(16 << 20)
        left = size
        while left:
            left -= f.write(block[: min(left, len(block))])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / MB
    return float("nan")


def start_server(root: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    ready = workdir / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servefleet_dev.hub",
            "serve",
            "--root",
            str(root),
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("hub server did not start")
        time.sleep(0.05)
    url = ready.read_text().split()[0]
    hub.wait_ready(url)
    return proc, url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="file size in MiB (default 1024)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--sparse", action="store_true", help="a sparse file of zeros instead of random data"
    )
    args = parser.parse_args()
    size = args.size_mb << 20

    workdir = Path(tempfile.mkdtemp(prefix="hub-bench-", dir=cache_subdir("bench")))
    try:
        src = workdir / "src"
        src.mkdir()
        t0 = time.monotonic()
        make_file(src / FILENAME, size, args.sparse)
        t1 = time.monotonic()
        sha = hub.publish(workdir / "store", REPO, src, link=True)  # hashing 1 GB: the slow part
        t2 = time.monotonic()
        print(f"file: {size / MB:.0f} MB ({'sparse' if args.sparse else 'random'}) in {workdir}")
        print(
            f"created in {t1 - t0:.1f} s, published (sha256 + link) in {t2 - t1:.1f} s, commit {sha[:12]}"
        )
        with open(src / FILENAME, "rb") as f:
            expected = hashlib.file_digest(f, "sha256").hexdigest()

        server, url = start_server(workdir / "store", workdir)
        try:
            times = []
            for run in range(1, args.runs + 1):
                cache = workdir / f"cache{run}"
                os.sync()  # don't bill this run for writing back the previous run's dirty pages
                began = time.monotonic()
                path = hf_hub_download(REPO, FILENAME, cache_dir=cache, endpoint=url)
                times.append(time.monotonic() - began)
                if os.path.getsize(path) != size:
                    raise SystemExit(
                        f"run {run}: downloaded {os.path.getsize(path)} bytes, expected {size}"
                    )
                if run == 1:  # once is enough, and it takes seconds
                    with open(path, "rb") as f:
                        if hashlib.file_digest(f, "sha256").hexdigest() != expected:
                            raise SystemExit("run 1: sha256 mismatch")
                shutil.rmtree(cache)
            stats = hub.hub_stats(url)
            rss = peak_rss_mb(server.pid)
        finally:
            server.terminate()
            server.wait(10)

        print()
        print(f"{'run':>4} {'seconds':>9} {'MB/s':>9}")
        for run, secs in enumerate(times, 1):
            print(f"{run:>4} {secs:>9.2f} {size / MB / secs:>9.0f}")
        med = statistics.median(times)
        print(f"{'median':>4} {med:>9.2f} {size / MB / med:>9.0f}")
        print()
        print(
            f"upstream bytes served: {stats['total_bytes']} ({stats['total_bytes'] / size:.2f} x file)"
        )
        print(f"server peak RSS: {rss:.0f} MB (file: {size / MB:.0f} MB)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
