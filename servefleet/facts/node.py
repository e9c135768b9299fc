"""Facts about a node: OS, CPU, memory, disk, NVIDIA GPUs. One shell command each; the parsers
are servefleet.core.node's, unit-tested on real output."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand

from servefleet.core import node_output
from servefleet.core.node import (
    NVIDIA_SMI_QUERY,
    PATH_CHAIN_FORMAT,
    Gpu,
    parse_account,
    parse_installed_debs,
    parse_meminfo,
    parse_nvidia_smi,
    parse_os_release,
    parse_path_chain,
    parse_path_stat,
)


class OsRelease(FactBase[dict]):
    """`/etc/os-release` as a dict, plus `family` (ubuntu | debian | the ID)."""

    def command(self) -> str:
        return "cat /etc/os-release"

    def process(self, output: list[str]) -> dict:
        return parse_os_release(output)


class CpuArch(FactBase[str]):
    """`uname -m`: x86_64 or aarch64."""

    def command(self) -> str:
        return "uname -m"


class MemoryBytes(FactBase[dict]):
    """Total and available system memory in bytes, from /proc/meminfo."""

    def command(self) -> str:
        return "cat /proc/meminfo"

    def process(self, output: list[str]) -> dict:
        return parse_meminfo(output)


class FreeDiskBytes(FactBase[int]):
    """Free bytes on the filesystem that holds path (or its nearest existing parent)."""

    def command(self, path: str) -> StringCommand:
        # The servefleet root may not exist yet: walk up to the directory that will hold it.
        return StringCommand(
            StringCommand("p=", QuoteString(path), _separator=""),
            '; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -P -B1 "$p" | tail -n 1',
        )

    def process(self, output: list[str]) -> int:
        return int(output[-1].split()[3])


class NvidiaGpus(FactBase[list[Gpu]]):
    """GPUs as nvidia-smi lists them; [] on a host without nvidia-smi (no warning: a host
    without a GPU is an answer, not an ordering error)."""

    default = list

    def command(self) -> str:
        return f"if command -v nvidia-smi >/dev/null 2>&1; then {NVIDIA_SMI_QUERY}; fi; true"

    def process(self, output: list[str]) -> list[Gpu]:
        return parse_nvidia_smi(output)


class GpuMemoryUsed(FactBase[list[float]]):
    """MiB in use on each GPU ([] without nvidia-smi)."""

    default = list

    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi "
            "--query-gpu=memory.used --format=csv,noheader,nounits; fi; true"
        )

    def process(self, output: list[str]) -> list[float]:
        return [float(x) for x in output if x.strip().replace(".", "", 1).isdigit()]


class DirEntries(FactBase[list[str]]):
    """Names directly under a directory ([] when it does not exist)."""

    default = list

    def command(self, path: str) -> StringCommand:
        # Names as bytes (core.node_output): a newline or a non-UTF-8 byte stays in its name.
        return StringCommand(
            "find",
            QuoteString(path),
            "-mindepth 1 -maxdepth 1 -printf '%P\\0'",
            f"2>/dev/null | {node_output.ENCODE}",
        )

    def process(self, output: list[str]) -> list[str]:
        return sorted(node_output.names(node_output.decode(output, "a directory's names")))


class InstalledDebs(FactBase[set[str]]):
    """Which of the named Debian packages are installed (dpkg's status ``ii``): a set. Asks
    dpkg about these names only, instead of listing every package."""

    default = set

    def command(self, names: tuple[str, ...]) -> StringCommand:
        return StringCommand(
            "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'",
            *[QuoteString(n) for n in names],
            "2>/dev/null; true",
        )

    def process(self, output: list[str]) -> set[str]:
        return parse_installed_debs(output)


class Account(FactBase[dict]):
    """A system account, its group and the groups it is in: ``{"user": passwd fields or None,
    "group": group fields or None, "groups": [names]}`` (``getent`` and ``id``: local files or
    whatever NSS the node uses)."""

    default = dict

    def command(self, user: str, group: str) -> StringCommand:
        return StringCommand(
            "getent passwd",
            QuoteString(user),
            "| sed 's/^/passwd:/';",
            "getent group",
            QuoteString(group),
            "| sed 's/^/group:/';",
            "id -Gn --",
            QuoteString(user),
            "2>/dev/null | sed 's/^/groups:/';",
            "true",
        )

    def process(self, output: list[str]) -> dict:
        return parse_account(output)


class PathStat(FactBase[dict | None]):
    """Type, owner, group and mode of a path, not following a final symlink:
    ``{"type": "directory", "user": "root", "group": "root", "mode": "755"}``, or None."""

    def command(self, path: str) -> StringCommand:
        return StringCommand("stat -c '%F|%U|%G|%a' --", QuoteString(path), "2>/dev/null; true")

    def process(self, output: list[str]) -> dict | None:
        return parse_path_stat(output)


class PathChain(FactBase[dict | None]):
    """Owner and mode of a path and of every directory above it up to /, not following
    symlinks, then the same for the path it resolves to (``readlink -m``): whoever may change
    any of them may change what is there. ``{"W": [...], "R": [...]}``, each component as
    ``{"type", "uid", "user", "mode", "path"}``, missing ones left out; None when unread
    (servefleet.core.node.parse_path_chain)."""

    def command(self, path: str) -> StringCommand:
        # The chain by parameter expansion (no dirname per level), one stat for all of it.
        return StringCommand(
            StringCommand("w=", QuoteString(path), _separator=""),
            '; for t in W R; do [ "$t" = R ] && w=$(readlink -m -- "$w"); p=$w; set --; '
            'while :; do set -- "$@" "$p"; q=${p%/*}; q=${q:-/}; [ "$q" = "$p" ] && break; '
            f'p=$q; done; stat -c "$t|{PATH_CHAIN_FORMAT}" -- "$@" 2>/dev/null; done; true',
        )

    def process(self, output: list[str]) -> dict | None:
        return parse_path_chain(output)
