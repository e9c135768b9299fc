"""Which Debian release and architecture a testbed host runs, named with its host name.

A host is named `ROLE-N` (Debian 12 on this machine's architecture, as always) or
`ROLE-N@PLATFORM`, PLATFORM being a release, an architecture or both joined by '-':
`spark-1@trixie`, `spark-2@arm64`, `spark-3@trixie-arm64`, `rtx4090-1@bookworm-amd64`. The suffix
is not part of the name: the guest's hostname, its inventory name and `rm`/`ssh` use `spark-1`;
the testbed's state records the release and architecture it was created with.
"""

import os
from dataclasses import dataclass

RELEASES = {"bookworm": "12", "trixie": "13"}  # Debian codename -> version
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}  # Debian architecture -> `uname -m`
DEFAULT_RELEASE = "bookworm"
DEFAULT_ARCH = "amd64"


@dataclass(frozen=True)
class HostSpec:
    """A host as named on the command line: release/arch are None where the name gave none."""

    name: str
    release: str | None = None
    arch: str | None = None


def parse(spec: str) -> HostSpec:
    """`spark-1@trixie-arm64` -> HostSpec("spark-1", "trixie", "arm64"); ValueError if unknown."""
    name, sep, suffix = spec.partition("@")
    if not sep:
        return HostSpec(name)
    release = arch = None
    for word in suffix.split("-"):
        if word in RELEASES and release is None:
            release = word
        elif word in ARCHES and arch is None:
            arch = word
        else:
            raise ValueError(
                f"testbed host {spec!r}: after '@' comes a Debian release "
                f"({', '.join(RELEASES)}), an architecture ({', '.join(ARCHES)}) or both "
                f"joined by '-', e.g. {name}@trixie-arm64"
            )
    return HostSpec(name, release, arch)


def label(release: str, arch: str) -> str:
    """The suffix that names this platform: `trixie-arm64`."""
    return f"{release}-{arch}"


def emulated(arch: str) -> bool:
    """Whether guests of this architecture run under qemu-user on this machine."""
    return ARCHES[arch] != os.uname().machine
