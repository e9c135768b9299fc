"""Preflight facts about a node: OS, CPU, memory, disk, NVIDIA GPUs (custom pyinfra facts).

Each fact is one shell command and a pure parser, so the parsers are unit-tested on real output
(tests/fixtures/) and the same code reads a real GPU host and a testbed guest.
"""

from dataclasses import dataclass

from pyinfra.api import FactBase


class OsRelease(FactBase):
    """`/etc/os-release` as a dict, plus `family` (ubuntu | debian | the ID)."""

    def command(self):
        return "cat /etc/os-release"

    def process(self, output):
        return parse_os_release(output)


def parse_os_release(lines: list[str]) -> dict:
    info = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            info[key.strip().lower()] = value.strip().strip('"')
    info["family"] = info.get("id", "unknown")
    return info


class CpuArch(FactBase):
    """`uname -m`: x86_64 or aarch64."""

    def command(self):
        return "uname -m"


class MemoryBytes(FactBase):
    """Total and available system memory in bytes, from /proc/meminfo."""

    def command(self):
        return "cat /proc/meminfo"

    def process(self, output):
        return parse_meminfo(output)


def parse_meminfo(lines: list[str]) -> dict:
    values = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return {"total": values.get("MemTotal", 0), "available": values.get("MemAvailable", 0)}


class FreeDiskBytes(FactBase):
    """Free bytes on the filesystem that holds path (or its nearest existing parent)."""

    def command(self, path):
        # The servefleet root may not exist yet: walk up to the directory that will hold it.
        return (f"p={path}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                "df -P -B1 \"$p\" | tail -n 1")

    def process(self, output):
        fields = output[-1].split()
        return int(fields[3])


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int | None  # None where nvidia-smi reports [N/A] (GB10 unified memory)
    driver_version: str
    compute_capability: str | None

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".")[0])


NVIDIA_SMI_QUERY = ("nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap "
                    "--format=csv,noheader,nounits")


class NvidiaGpus(FactBase):
    """GPUs as nvidia-smi lists them; [] on a host without nvidia-smi."""

    def requires_command(self, *args, **kwargs):
        return "nvidia-smi"

    default = list

    def command(self):
        return NVIDIA_SMI_QUERY

    def process(self, output):
        return parse_nvidia_smi(output)


def _na(value: str) -> str | None:
    value = value.strip()
    return None if value in ("[N/A]", "N/A", "[Not Supported]", "") else value


def parse_nvidia_smi(lines: list[str]) -> list[Gpu]:
    gpus = []
    for line in lines:
        if not line.strip():
            continue
        index, name, memory, driver, cc = (f.strip() for f in line.split(","))
        mib = _na(memory)
        gpus.append(Gpu(
            index=int(index), name=name,
            memory_bytes=int(float(mib)) * 1024**2 if mib else None,
            driver_version=driver, compute_capability=_na(cc),
        ))
    return gpus
