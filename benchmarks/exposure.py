"""systemd's exposure score of both serving units, as the recipes render them.

Run: .venv/bin/python benchmarks/exposure.py [--systemd-analyze /usr/bin/systemd-analyze]
     .venv/bin/python benchmarks/exposure.py --node rtx4090-2   # a testbed host's own systemd

Each unit (servefleet-vllm.service from group_data spark + vllm, servefleet-llama.service from
group_data rtx4090 + llamacpp) is rendered by the recipes' own code (engines.vllm.logic /
engines.llamacpp.logic unit_context + core.systemd.render_unit, as tests/unit/test_gpu_devices.py renders them) with
require_gpu True (GPU nodes: DeviceAllow= and the nvidia-modprobe ExecStartPre=) and False
(the testbed, depots), written into a temporary directory and scored offline:

    systemd-analyze security --offline=yes --no-pager <dir>/<unit>

--offline=yes reads the unit file instead of asking the running manager (which does not know
these units here); a unit given as a path is loaded from that path. The score depends only on
the file and on systemd's version, which differs by release (Debian 12: 252, Debian 13: 257):
with --node NAME the files are scored on that testbed host (SERVEFLEET_TESTBED_INSTANCE picks
the testbed) by its own systemd-analyze, and the version printed is the one that host reports.
One capture per version: tests/fixtures/systemd/exposure-VERSION.txt (the first word after
"systemd" in the first line). Prints a table: unit, require_gpu, exposure (0 safest .. 10),
systemd-analyze's verdict.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servefleet.core.systemd import render_unit  # noqa: E402
from servefleet.engines.llamacpp import logic as llamacpp  # noqa: E402
from servefleet.engines.vllm import logic as vllm  # noqa: E402
from servefleet_dev.testbed import hosts  # noqa: E402
from servefleet_dev.testbed.material import load as group_data  # noqa: E402
from servefleet_dev.testbed.state import load_state  # noqa: E402

MODEL = "/opt/servefleet/models/org--name/" + "0" * 40
SCORE = re.compile(r"Overall exposure level for \S+: ([\d.]+) (\S+)")
VERSION = re.compile(r"^systemd (\d+) ")


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


def unit_files() -> dict[str, str]:
    """{relative path: text}: both units, for a GPU node (gpu/) and without one (cpu/)."""
    return {
        f"{'gpu' if gpu else 'cpu'}/{name}": text
        for gpu in (True, False)
        for name, text in units(gpu).items()
    }


def script(analyze: str, files: dict[str, str]) -> str:
    """A shell script that writes `files` into a temporary directory, prints systemd's version
    line, then `== PATH` and systemd-analyze's output for each file."""
    lines = ["set -e", "d=$(mktemp -d)", "trap 'rm -rf \"$d\"' EXIT", f"{analyze} --version"]
    for path, text in files.items():
        blob = base64.b64encode(text.encode()).decode()
        lines += [
            f'mkdir -p "$d/{os.path.dirname(path)}"',
            f'echo {blob} | base64 -d > "$d/{path}"',
            f"echo '== {path}'",
            f'{analyze} security --offline=yes --no-pager "$d/{path}" 2>&1 || true',
        ]
    return "\n".join(lines) + "\n"


def measure(analyze: str, node: str | None) -> tuple[str, list[tuple[str, bool, float, str]]]:
    """(systemd's version line, [(unit, require_gpu, exposure, verdict)]), scored here or on
    the testbed host `node` by its own systemd-analyze."""
    files = unit_files()
    text = script(shlex.quote(analyze), files)
    if node:
        rec = load_state().hosts[node]
        argv = [*hosts.ssh_args(rec), "sh", "-s"]
    else:
        argv = ["sh", "-s"]
    out = subprocess.run(argv, input=text, capture_output=True, text=True, check=False, timeout=300)
    version, _, rest = out.stdout.partition("\n")
    if out.returncode != 0 or not VERSION.match(version):
        raise SystemExit(f"{analyze} on {node or 'this machine'}: {out.stderr.strip()[-500:]}")
    rows = []
    for path, section in zip(files, rest.split("== ")[1:], strict=True):
        found = SCORE.search(section)
        if not found or not section.startswith(path):
            raise SystemExit(f"{analyze} scored no exposure for {path}: {section.strip()[-500:]}")
        gpu, name = path.split("/")
        rows.append((name, gpu == "gpu", float(found.group(1)), found.group(2)))
    return version, rows


def report(version: str, rows, where: str, analyze: str) -> str:
    head = [
        f"{version}; on {where}; command: {analyze} security --offline=yes --no-pager <tmp>/<unit>",
        f"{'unit':<28} {'require_gpu':<12} {'exposure':>8}  verdict",
    ]
    return "\n".join(
        head + [f"{n:<28} {str(g):<12} {v:>8.1f}  {verdict}" for n, g, v, verdict in rows]
    )


def version_of(text: str) -> str:
    """The systemd version a capture or a report names: `257` of "systemd 257 (257.13-...)"."""
    found = VERSION.match(text)
    if not found:
        raise ValueError(f"not a systemd version line: {text.splitlines()[0][:80]!r}")
    return found.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systemd-analyze", default="/usr/bin/systemd-analyze")
    parser.add_argument(
        "--node", help="a testbed host: score on it, with its own systemd (its version)"
    )
    args = parser.parse_args()
    os.chdir(ROOT)  # the templates and their includes resolve against the project
    version, rows = measure(args.systemd_analyze, args.node)
    print(report(version, rows, args.node or "this machine", args.systemd_analyze))
    return 0


if __name__ == "__main__":
    sys.exit(main())
