"""Models of two systemd sandbox settings, for where systemd is not there to apply them: the
unit tests (captured device tables) and the H200, which has no systemd
(tests/device/sandbox_exec.py applies them with the kernel's own means). Stdlib only.

DevicePolicy=closed + DeviceAllow= (systemd.resource-control(5); src/core/bpf-devices.c):
`closed` allows /dev/null, zero, full, random, urandom, tty and ptmx, plus each DeviceAllow=
entry. A `char-GLOB` entry is matched (fnmatch) against the character group names of
/proc/devices and allows every minor of each matching major; a `/dev/...` entry allows that
node's major:minor.

SystemCallFilter= (systemd.exec(5)): an allow list of names and @groups, groups expanded from
`systemd-analyze syscall-filter` (tests/fixtures/systemd/), a later `~` assignment removing from
it; anything else kills the process (no SystemCallErrorNumber= in servefleet's units).
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from pathlib import Path

# What `DevicePolicy=closed` always lets through (major, minor).
CLOSED_BASE = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)}
CLOSED_BASE_PATHS = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
)
# The nodes CUDA opens: /dev/nvidia<N>, /dev/nvidiactl, /dev/nvidia-uvm*, /dev/nvidia-caps/*.
CUDA_NODE = re.compile(r"/dev/(nvidia\d+|nvidiactl|nvidia-uvm(-tools)?|nvidia-caps/nvidia-cap\d+)")


class DeviceTable:
    """`cat /proc/devices` and `ls -l /dev/nvidia* /dev/nvidia-caps` as captured on a node."""

    def __init__(self, text: str):
        self.groups: list[tuple[int, str]] = []  # character devices: (major, name)
        self.nodes: dict[str, tuple[int, int]] = {}  # /dev path -> (major, minor)
        section, directory = None, "/dev"
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line.endswith("devices:"):
                section = line
                continue
            node = re.fullmatch(r"c[rwx-]{9}\.?\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+(\S+)", line)
            if node:
                name = node[3] if node[3].startswith("/") else f"{directory}/{node[3]}"
                self.nodes[name] = (int(node[1]), int(node[2]))
                section = None
            elif line.endswith(":") and line.startswith("/dev/"):
                directory = line[:-1]
            elif section == "Character devices:":
                major, name = line.split(None, 1)
                self.groups.append((int(major), name))

    @classmethod
    def read(cls, path: Path) -> DeviceTable:
        return cls(path.read_text())

    @classmethod
    def of_this_machine(cls) -> DeviceTable:
        """/proc/devices and every character node under /dev/nvidia* of the running machine."""
        table = cls(Path("/proc/devices").read_text())
        for root, _dirs, files in os.walk("/dev"):
            for name in files:
                path = os.path.join(root, name)
                if not path.startswith("/dev/nvidia"):
                    continue
                st = os.lstat(path)
                if stat.S_ISCHR(st.st_mode):
                    table.nodes[path] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        return table

    def majors(self, glob: str) -> set[int]:
        return {major for major, name in self.groups if fnmatch.fnmatchcase(name, glob)}


def device_allow(unit: str) -> list[str]:
    lines = unit.splitlines()
    assert "DevicePolicy=closed" in lines, "the model covers DevicePolicy=closed only"
    return [line.removeprefix("DeviceAllow=") for line in lines if line.startswith("DeviceAllow=")]


def allowed(unit: str, table: DeviceTable) -> tuple[set[int], set[tuple[int, int]]]:
    """(majors allowed whole, single major:minor allowed) for `unit` on `table`'s node."""
    majors, exact = set(), set(CLOSED_BASE)
    for entry in device_allow(unit):
        spec, _, access = entry.partition(" ")
        if not set(access) <= set("rwm"):
            raise ValueError(f"DeviceAllow={entry}: access {access!r}")
        if spec.startswith("char-"):
            majors |= table.majors(spec.removeprefix("char-"))
        elif spec.startswith("/dev/") and spec in table.nodes:
            exact.add(table.nodes[spec])
        elif spec.startswith("block-"):
            raise ValueError(f"DeviceAllow={entry}: block devices are not modelled")
    return majors, exact


def reachable(unit: str, table: DeviceTable) -> dict[str, bool]:
    """Every captured /dev node -> may the unit's processes open it."""
    majors, exact = allowed(unit, table)
    return {path: mm[0] in majors or mm in exact for path, mm in table.nodes.items()}


def problems(unit: str, table: DeviceTable) -> list[str]:
    """What is wrong with the unit's device access on that node ([] = exactly the CUDA nodes)."""
    found = []
    for path, ok in reachable(unit, table).items():
        if CUDA_NODE.fullmatch(path) and not ok:
            found.append(f"{path} {table.nodes[path]} is not allowed")
    cuda_majors = {table.nodes[p][0] for p in table.nodes if CUDA_NODE.fullmatch(p)}
    majors, exact = allowed(unit, table)
    for major in sorted(majors - cuda_majors):
        names = [n for m, n in table.groups if m == major]
        found.append(f"major {major} {names} is allowed but holds no CUDA node")
    for mm in sorted(exact - CLOSED_BASE):
        if mm[0] not in cuda_majors:
            found.append(f"{mm} is allowed but is no CUDA node")
    return found


# --- SystemCallFilter= ---------------------------------------------------------------------------


def syscall_groups(text: str) -> dict[str, list[str]]:
    """`systemd-analyze syscall-filter` output -> {"@group": [members, nested @groups by name]}."""
    groups, current = {}, None
    for line in text.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif current is not None and line.startswith("    ") and not line.strip().startswith("#"):
            current.append(line.strip())
        elif not line.strip():
            current = None
    return groups


def expand(word: str, groups: dict[str, list[str]]) -> set[str]:
    if not word.startswith("@"):
        return {word}
    if word not in groups:
        raise ValueError(f"unknown system-call group {word}")
    names: set[str] = set()
    for member in groups[word]:
        names |= expand(member, groups)
    return names


def syscall_allow_list(unit: str, groups: dict[str, list[str]]) -> set[str]:
    """The system calls the unit's SystemCallFilter= lines allow (an allow list, then `~` lines)."""
    allow: set[str] | None = None
    for line in unit.splitlines():
        if not line.startswith("SystemCallFilter="):
            continue
        value = line.removeprefix("SystemCallFilter=")
        words = value.lstrip("~").split()
        names = set().union(*(expand(w, groups) for w in words)) if words else set()
        if value.startswith("~"):
            if allow is None:
                raise ValueError("a deny-list filter is not modelled: servefleet's units allow")
            allow -= names
        else:
            allow = names if allow is None else allow | names
    if allow is None:
        raise ValueError("the unit has no SystemCallFilter=")
    return allow
