"""Foreign-architecture guests: qemu-user registered with binfmt_misc so the kernel runs their
binaries, also from inside a container.

Debian's qemu-user-static ships the registration (/usr/lib/binfmt.d/qemu-aarch64.conf, flags
`POF`) but registers it only through systemd-binfmt or binfmt-support at boot, which a machine
without systemd as PID 1 never runs. The testbed needs two flags:
- `F` (fix binary): the kernel opens the interpreter when it is registered, so it is found from
  inside a guest's root, which has no /usr/bin/qemu-aarch64-static;
- `C` (credentials, implies `O`): setuid binaries keep their bit under emulation, else the admin's
  `sudo` in an arm64 guest refuses to run ("must be owned by uid 0 and have the setuid bit set").

`python -m servefleet_dev.testbed.binfmt` does it (bin/setup runs it); `servefleet testbed up`
does it again before an emulated guest boots (the registration does not survive a reboot).
"""

import subprocess
import sys
from pathlib import Path

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
DEBIAN_CONF = Path("/usr/lib/binfmt.d")  # qemu-user-static's registrations, one file each
QEMU = {"arm64": "aarch64"}  # Debian architecture -> qemu's name for it
NEEDED_FLAGS = "FC"


def _mounted() -> bool:
    with open("/proc/self/mounts") as fh:
        return any(line.split()[1] == str(BINFMT_DIR) for line in fh)


def _flags(entry: Path) -> str:
    for line in entry.read_text().splitlines():
        if line.startswith("flags:"):
            return line.split(":", 1)[1].strip()
    return ""


def registration(conf_line: str) -> str:
    """Debian's registration line with the flags the testbed needs added (`:name:M::magic:mask:
    interpreter:flags`); `C` implies `O`."""
    fields = conf_line.strip().split(":")
    if len(fields) != 8 or fields[0]:
        raise ValueError(f"not a binfmt_misc registration: {conf_line!r}")
    flags = fields[7] + "".join(f for f in NEEDED_FLAGS if f not in fields[7])
    return ":".join([*fields[:7], flags if "O" in flags else flags + "O"])


def ensure(arch: str, log=print) -> Path:
    """Make sure binaries of `arch` run here, with the F and C flags; returns the entry."""
    name = f"qemu-{QEMU[arch]}"
    if not _mounted():
        log(f"mounting binfmt_misc on {BINFMT_DIR}")
        subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)],
            check=True,
        )
    entry = BINFMT_DIR / name
    if entry.exists() and all(f in _flags(entry) for f in NEEDED_FLAGS):
        return entry
    conf = DEBIAN_CONF / f"{name}.conf"
    if not conf.exists():
        raise RuntimeError(
            f"{conf} is missing: install Debian's qemu-user-static (bin/setup does) to run "
            f"{arch} guests"
        )
    line = registration(next(ln for ln in conf.read_text().splitlines() if ln.startswith(":")))
    if entry.exists():  # registered without F or C (Debian's own flags): replace it
        log(f"re-registering {name} with flags {NEEDED_FLAGS} (had {_flags(entry) or 'none'})")
        entry.write_text("-1")
    else:
        log(f"registering {name} with binfmt_misc")
    (BINFMT_DIR / "register").write_text(line)
    return entry


def main() -> int:
    for arch in QEMU:  # says something only when it registers
        ensure(arch, log=lambda m: print(f"bin/setup: {m}", file=sys.stderr))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
