"""Put the vLLM engine stand-in onto a (guest) filesystem: one executable plus its data dir.

    exe = install("/srv/guest-root/opt/servefleet-standin")
    # -> .../vllm-standin (0755) and .../standin-data/ (0755) holding index.json, the recorded
    #    engine logs and the captured `vllm serve --help=all` text (0644), all owned by root:root

The data comes from tests/fixtures/h200/vllm/ (the real engine's logs recorded on an H200, see its
index.json). Only the files index.json names are copied; a rerun replaces what an earlier one
left, so the step is idempotent.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from servefleet_dev.standin import vllm_standin

PROGRAM = Path(vllm_standin.__file__)
EXECUTABLE_NAME = "vllm-standin"
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "h200" / "vllm"


def data_files(fixtures: Path = FIXTURES) -> list[str]:
    """index.json and every file it names (recordings and the serve help text)."""
    index = json.loads((fixtures / "index.json").read_text())
    names = ["index.json", *(entry["file"] for entry in index["serve_help"])]
    names += [rec["file"] for rec in index["recordings"]]
    missing = [n for n in names if not (fixtures / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{fixtures}: index.json names missing files {missing}")
    return names


def _own(path: Path, mode: int) -> None:
    os.chmod(path, mode)
    if os.geteuid() == 0:  # the testbed's material step runs as root; others cannot chown
        os.chown(path, 0, 0, follow_symlinks=False)


def install(dest_dir: str | Path, fixtures: Path = FIXTURES) -> Path:
    """Copy the stand-in and its data into dest_dir; return the executable's path."""
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    _own(dest, 0o755)
    names = data_files(fixtures)

    # The data dir is built beside its final place and swapped in: no half-copied state.
    data = dest / vllm_standin.DATA_DIR_NAME
    staging = Path(tempfile.mkdtemp(prefix=".standin-data-", dir=dest))
    try:
        for name in names:
            shutil.copyfile(fixtures / name, staging / name)
            _own(staging / name, 0o644)
        _own(staging, 0o755)
        if data.exists():
            shutil.rmtree(data)
        staging.rename(data)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    exe = dest / EXECUTABLE_NAME
    tmp = dest / f".{EXECUTABLE_NAME}.tmp"
    shutil.copyfile(PROGRAM, tmp)
    _own(tmp, 0o755)
    tmp.replace(exe)
    return exe
