"""systemd's exposure score of both serving units, as the recipes render them.

Run: .venv/bin/python benchmarks/exposure.py [--systemd-analyze /usr/bin/systemd-analyze]

Each unit (servefleet-vllm.service from group_data spark, servefleet-llama.service from
group_data rtx4090) is rendered by the recipes' own code (core.vllm / core.llamacpp
unit_context + core.systemd.render_unit, as tests/unit/test_gpu_devices.py renders them) with
require_gpu True (GPU nodes: DeviceAllow= and the nvidia-modprobe ExecStartPre=) and False
(the testbed, depots), written into a temporary directory and scored offline:

    systemd-analyze security --offline=yes --no-pager <dir>/<unit>

--offline=yes reads the unit file instead of asking the running manager (which does not know
these units here); a unit given as a path is loaded from that path. The score depends only on
the file (and systemd's version: the table is systemd 252's, Debian 12). Prints a table: unit,
require_gpu, exposure (0 safest .. 10), systemd-analyze's verdict.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servefleet.core.systemd import render_unit  # noqa: E402
from servefleet.engines.llamacpp import logic as llamacpp  # noqa: E402
from servefleet.engines.vllm import logic as vllm  # noqa: E402
from servefleet_dev.testbed.material import load as group_data  # noqa: E402

MODEL = "/opt/servefleet/models/org--name/" + "0" * 40
SCORE = re.compile(r"Overall exposure level for \S+: ([\d.]+) (\S+)")


def units(require_gpu: bool) -> dict[str, str]:
    """{unit file name: text} of both units, from the shipped group data of their role."""
    spark = {**group_data("all", "spark", "vllm"), "require_gpu": require_gpu}
    rtx = {**group_data("all", "rtx4090", "llamacpp"), "require_gpu": require_gpu}
    return {
        vllm.UNIT: render_unit(
            "files/vllm/servefleet-vllm.service.j2", vllm.unit_context(spark, MODEL)
        ),
        llamacpp.UNIT: render_unit(
            "files/llamacpp/servefleet-llama.service.j2",
            llamacpp.unit_context(rtx, MODEL, lambda: None),
        ),
    }


def score(analyze: str, unit_file: Path) -> tuple[float, str]:
    out = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(unit_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = SCORE.search(out.stdout)
    if not found:
        raise SystemExit(
            f"{analyze} scored no exposure for {unit_file} (exit {out.returncode}): "
            f"{(out.stderr or out.stdout).strip()[-500:]}"
        )
    return float(found.group(1)), found.group(2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systemd-analyze", default="/usr/bin/systemd-analyze")
    args = parser.parse_args()
    os.chdir(ROOT)  # the templates and their includes resolve against the project
    version = subprocess.run(
        [args.systemd_analyze, "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]
    print(
        f"{version}; command: {args.systemd_analyze} security --offline=yes --no-pager <tmp>/<unit>"
    )
    print(f"{'unit':<28} {'require_gpu':<12} {'exposure':>8}  verdict")
    with tempfile.TemporaryDirectory(prefix="servefleet-exposure-") as tmp:
        for gpu in (True, False):
            for name, text in units(gpu).items():
                path = Path(tmp) / ("gpu" if gpu else "cpu") / name
                path.parent.mkdir(exist_ok=True)
                path.write_text(text)
                value, verdict = score(args.systemd_analyze, path)
                print(f"{name:<28} {str(gpu):<12} {value:>8.1f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
