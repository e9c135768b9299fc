"""Command-line arguments of the fleet verbs, refused before any host is reached (exit 2, one
line): --batch is N hosts or P% of them (whole numbers, 1% to 100%), --max-failures a count from
0 (servefleet/verbs/rollout.py batch_size, max_failures_of); `rollback` of a glob or group that
selects more hosts than were named one by one needs --all (servefleet/verbs/rollback.py).

The real `servefleet` command runs against a fleet of hosts on closed ports of 127.0.0.1: a
verb that got as far as connecting would say "cannot reach" (exit 3) instead. The fleet file
and the operator's cache are checked unchanged.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.hostile.cases_gguf import scratch
from tests.hostile.table import refused

CATEGORY = "command-line arguments"
REPO = Path(__file__).resolve().parents[2]
FLEET = (
    "hosts:\n"
    "  - {name: spark-01, role: spark, ssh_hostname: 127.0.0.1, ssh_port: 1}\n"
    "  - {name: spark-02, role: spark, ssh_hostname: 127.0.0.1, ssh_port: 2}\n"
)


def listing(tmp: Path) -> dict[str, str]:
    return {
        str(p.relative_to(tmp)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tmp.rglob("*"))
        if p.is_file()
    }


def cli_refusal(*args: str):
    """`servefleet ARGS` with that fleet: its refusal (stderr's one line, or the report's
    message), None when it was not refused with exit 2 before touching a host."""

    def attempt():
        with scratch() as tmp:
            (tmp / "fleet.yml").write_text(FLEET)
            (tmp / "cache").mkdir()
            before = listing(tmp)
            env = {
                **os.environ,
                "SERVEFLEET_FLEET": str(tmp / "fleet.yml"),
                "SERVEFLEET_CACHE": str(tmp / "cache"),
                "COLUMNS": "80",
                "PYTHONPATH": str(REPO),
            }
            done = subprocess.run(
                [sys.executable, "-m", "servefleet.cli", *args],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert listing(tmp) == before, "the refused command changed files"
        if done.returncode != 2:
            assert "Traceback" not in done.stderr, done.stderr[-1500:]
            return None
        err = done.stderr.strip().splitlines()
        if err:
            assert len(err) == 1, done.stderr[-1500:]
            return err[0]
        report = done.stdout.strip().splitlines()  # the message (wrapped at 80), then the exit
        assert report[-1].endswith(": exit 2"), done.stdout[-1500:]
        return " ".join(line.strip() for line in report[:-1])

    return attempt


ROLLOUT = ("rollout", "inventory/spark.py", "deploys/serve_bf16.py")
BATCHES = [
    "inf%",
    "1e400%",
    "Infinity%",
    "-50%",
    "0%",
    "101%",
    "1.5",
    "nan%",
    "0x10",
    "\uff12",  # a fullwidth 2: int() reads it, a batch is ASCII digits
    "3 4",
    "50%%",
    "1e3",
    "+2",
    "0",
]

CASES = [
    *[
        refused(
            CATEGORY, f"rollout --batch {b!r}", "--batch", cli_refusal(*ROLLOUT, f"--batch={b}")
        )
        for b in BATCHES
    ],
    refused(
        CATEGORY,
        "rollout --max-failures -1",
        "--max-failures -1: expected a number",
        cli_refusal(*ROLLOUT, "--max-failures", "-1"),
    ),
    refused(
        CATEGORY,
        "rollout --max-failures beyond any fleet",
        "--max-failures 1000000000",
        cli_refusal(*ROLLOUT, "--max-failures", "1000000000"),
    ),
    refused(
        CATEGORY,
        "rollback --limit '*' without --all",
        "needs --all",
        cli_refusal("rollback", "inventory/spark.py", "--limit", "*"),
    ),
    refused(
        CATEGORY,
        "rollback --limit of a group without --all",
        "needs --all",
        cli_refusal("rollback", "inventory/spark.py", "--limit", "spark"),
    ),
    refused(
        CATEGORY,
        "rollback --limit 'spark-0?' without --all",
        "selects 2 hosts",
        cli_refusal("rollback", "inventory/spark.py", "--limit", "spark-0?"),
    ),
]
