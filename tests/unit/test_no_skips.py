"""A skipped test counts as not run: the session fails on it (tests/conftest.py), so a CI run
cannot go green with a tier quietly missing."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).parent


def test_a_skip_fails_the_run_and_says_why():
    probe = HERE / f".skip-probe-{uuid.uuid4().hex[:8]}"  # a dot directory: not collected
    probe.mkdir()
    try:
        (probe / "test_probe.py").write_text(
            "import pytest\n\ndef test_needs_a_tool():\n    pytest.skip('no frobnicator')\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "SERVEFLEET_ALLOW_SKIPS"}
        env["SERVEFLEET_NO_PREFETCH"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "-q",
            str(probe / "test_probe.py"),
        ]
        run = subprocess.run(
            cmd, cwd=HERE.parent.parent, capture_output=True, text=True, env=env, timeout=300
        )
        assert run.returncode == 1, run.stdout[-2000:]
        assert "skipped, which counts as not run" in run.stdout and "no frobnicator" in run.stdout
        allowed = subprocess.run(
            cmd,
            cwd=HERE.parent.parent,
            capture_output=True,
            text=True,
            env={**env, "SERVEFLEET_ALLOW_SKIPS": "1"},
            timeout=300,
        )
        assert allowed.returncode == 0 and "1 skipped" in allowed.stdout, allowed.stdout[-2000:]
    finally:
        shutil.rmtree(probe)
