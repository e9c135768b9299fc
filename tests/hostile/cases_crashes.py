"""Inputs that used to crash (a traceback), hang (a FIFO) or read without end (/dev/zero)
instead of ending in one line: every file the operator names is a regular file, read with a
bound (servefleet/core/operator_files.py); fleet.yml keys are strings and its nesting is
bounded (servefleet/fleet/inventory.py); the fleet key is checked when the data is.

Each case runs under a deadline, and checks that the directory it works in is unchanged (the
FIFO still a FIFO, no file written, no fleet key generated).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from servefleet.core.errors import DataError
from servefleet.fleet.data import HostData, Layer, validate
from servefleet_dev.testbed.material import load
from tests.hostile.cases_fleet import child_refusal
from tests.hostile.cases_gguf import _deadline, scratch
from tests.hostile.table import refused

CATEGORY = "crash inputs"
DEADLINE_S = 10
SPARK = load("all", "spark", "vllm")


def listing(directory: Path) -> dict[str, str]:
    """Each entry's kind and size, never opening one (a FIFO would block)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(directory))] = f"{stat.filemode(st.st_mode)} {st.st_size}"
    return out


def validation_refusal(key: str, make, recipe: str = "serve_bf16"):
    """validate() of spark data whose `key` names the path make(tmp) returns: the refusal line,
    within DEADLINE_S, with the scratch directory and the fleet-key cache unchanged."""

    def attempt():
        with scratch() as tmp:
            cache = tmp / "cache"
            cache.mkdir()
            saved = os.environ.get("SERVEFLEET_CACHE")
            os.environ["SERVEFLEET_CACHE"] = str(cache)
            try:
                path = make(tmp)
                before = listing(tmp)
                layers = [Layer("--data", {key: str(path)}), Layer("group_data", SPARK)]
                try:
                    with _deadline(DEADLINE_S):
                        validate(HostData("spark-01", ["spark"], layers), recipe)
                    message = None
                except DataError as exc:
                    message = str(exc)
                assert listing(tmp) == before, "the validation changed files"
                return message
            finally:
                if saved is None:
                    os.environ.pop("SERVEFLEET_CACHE", None)
                else:
                    os.environ["SERVEFLEET_CACHE"] = saved

    return attempt


def fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def device(name: str):
    """A link in the scratch directory to /dev/<name> (so nothing outside it is named)."""

    def make(tmp: Path) -> Path:
        (tmp / name).symlink_to(f"/dev/{name}")
        return tmp / name

    return make


def directory(tmp: Path) -> Path:
    (tmp / "a-dir").mkdir()
    return tmp / "a-dir"


def key_case(key: str, name: str, make, expected: str):
    return refused(CATEGORY, f"{key}: {name}", expected, validation_refusal(key, make))


def _write(text: str):
    def write(path: Path):
        path.write_text(text)

    return write


def _fleet_fifo(path: Path):
    os.mkfifo(path)


def _fleet_zero(path: Path):
    path.symlink_to("/dev/zero")


def fleet_case(name: str, expected: str, write):
    # In a child with a time and memory limit: a hang or a RecursionError cannot take the suite.
    return refused(CATEGORY, f"fleet.yml: {name}", expected, child_refusal(write))


CASES = [
    fleet_case(
        "a list as a key (? [a] : x)",
        "a key of type seq: expected a string key",
        _write("? [a]\n: x\nhosts: []\n"),
    ),
    fleet_case(
        "a mapping as a key in a host entry",
        "a key of type map",
        _write("hosts:\n  - name: a\n    role: spark\n    ? {x: 1}\n    : y\n"),
    ),
    fleet_case(
        "an integer key in data:",
        "a key of type int",
        _write("hosts:\n  - {name: a, role: spark, data: {5: x}}\n"),
    ),
    fleet_case(
        "5,000 nested [ (10 KB)",
        "nested more than 32 levels deep",
        _write("hosts: " + "[" * 5000 + "\n"),
    ),
    fleet_case(
        "5,000 nested flow mappings",
        "nested more than 32 levels deep",
        _write("hosts: " + "{a: " * 5000 + "\n"),
    ),
    fleet_case(
        "5,000 nested block sequences on one line (- - - ...)",
        "nested more than 32 levels deep",
        _write("hosts:\n" + "- " * 5000 + "x\n"),
    ),
    fleet_case(
        "a FIFO (would wait for a writer)",
        "is a FIFO (named pipe), not a regular file",
        _fleet_fifo,
    ),
    fleet_case(
        "a link to /dev/zero (endless)", "is a character device, not a regular file", _fleet_zero
    ),
    key_case(
        "api_key_file",
        "a FIFO (would hang the run)",
        fifo,
        "is a FIFO (named pipe), not a regular file",
    ),
    key_case(
        "api_key_file",
        "/dev/zero (endless)",
        device("zero"),
        "is a character device, not a regular file",
    ),
    key_case("api_key_file", "a directory", directory, "is a directory, not a regular file"),
    key_case("hf_token_file", "a FIFO", fifo, "is a FIFO (named pipe), not a regular file"),
    key_case(
        "hf_token_file",
        "/dev/urandom (endless)",
        device("urandom"),
        "is a character device, not a regular file",
    ),
    key_case("depot_ssh_key", "a FIFO", fifo, "is a FIFO (named pipe), not a regular file"),
    key_case(
        "depot_ssh_key",
        "/dev/zero (endless)",
        device("zero"),
        "is a character device, not a regular file",
    ),
    key_case("depot_ssh_key", "a directory", directory, "is a directory, not a regular file"),
]
