"""The testbed's base root filesystems, one per Debian release and architecture, each built once
with mmdebstrap and cached by the hash of its recipe."""

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from servefleet.core.paths import cache_subdir
from servefleet_dev.testbed import binfmt
from servefleet_dev.testbed.platforms import DEFAULT_ARCH, DEFAULT_RELEASE, emulated, label
from servefleet_dev.testing.wheels import cache_lock

MIRROR = "http://deb.debian.org/debian"
# What a bare node has before servefleet touches it: an init system, sshd and a Python for pyinfra.
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "ca-certificates",
    "iproute2",
    "sudo",
    "curl",
]
# The host's CA certificates: HTTPS from guests goes through an intercepting proxy.
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")

ADMIN_USER = "fleetadmin"  # every guest's login for servefleet: sudo, like a real fleet
ADMIN_UID = 1000

# Run inside the new root ($1) after packages are installed.
CUSTOMIZE = [
    # Guests get their address from systemd-networkd (seeded per host).
    'chroot "$1" systemctl enable systemd-networkd ssh',
    # Units that cannot work in a container and would only mark the system degraded.
    'chroot "$1" systemctl mask systemd-timesyncd.service getty@tty1.service '
    "console-getty.service systemd-resolved.service 2>/dev/null || true",
    'rm -f "$1"/etc/ssh/ssh_host_*',  # each host gets its own keys, made when it is seeded
    'chroot "$1" update-ca-certificates --fresh >/dev/null',
    # Keep downloaded .debs: /var/cache/apt/archives is a host-side cache shared by all guests.
    'echo \'Binary::apt::APT::Keep-Downloaded-Packages "true";\' > "$1"/etc/apt/apt.conf.d/10keep',
    'rm -f "$1"/etc/apt/apt.conf.d/docker-clean',
    "echo 'PermitRootLogin prohibit-password' > \"$1\"/etc/ssh/sshd_config.d/servefleet.conf",
    # The account a real fleet logs in with (DGX OS's default): not root, passwordless sudo.
    f'chroot "$1" useradd --uid {ADMIN_UID} --create-home --shell /bin/bash {ADMIN_USER}',
    f"echo '{ADMIN_USER} ALL=(ALL) NOPASSWD:ALL' > \"$1\"/etc/sudoers.d/{ADMIN_USER}",
    f'chmod 0440 "$1"/etc/sudoers.d/{ADMIN_USER}',
]


def _ca_files() -> list[Path]:
    return sorted(HOST_CA_DIR.glob("*.crt")) if HOST_CA_DIR.is_dir() else []


def recipe_hash(
    release: str = DEFAULT_RELEASE,
    arch: str = DEFAULT_ARCH,
    packages: list[str] = PACKAGES,
    dpkg_opts: tuple[str, ...] = (),
) -> str:
    """Hash of everything that builds the image, so a changed recipe builds a new one."""
    h = hashlib.sha256()
    recipe = [release, arch, MIRROR, packages, CUSTOMIZE]
    recipe += [list(dpkg_opts)] if dpkg_opts else []
    h.update(json.dumps(recipe).encode())
    for ca in _ca_files():
        h.update(ca.name.encode() + ca.read_bytes())
    return h.hexdigest()[:16]


def of_kind(kind: str, name: str) -> bool:
    """Whether an image directory is `kind`'s, of any recipe: exactly `kind`-<hash>, so that
    base-bookworm-amd64 is not base-bookworm-amd64-extra's, nor bookworm's of older testbeds."""
    return re.fullmatch(re.escape(kind) + "-[0-9a-f]{16}", name) is not None


def _mounted_lowerdirs() -> set[str]:
    """Images that running guests (of any testbed instance) have as their overlay's lower dir."""
    found = set()
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] == "overlay":
                for opt in fields[3].split(","):
                    if opt.startswith("lowerdir="):
                        found.update(opt[len("lowerdir=") :].split(":"))
    return found


def base_image(release: str = DEFAULT_RELEASE, arch: str = DEFAULT_ARCH, log=print) -> Path:
    """Return the cached base rootfs directory of this release and architecture, building it
    first when missing (~30 s native; an emulated one runs its maintainer scripts under qemu).

    Under a machine-wide lock: testbeds brought up side by side (parallel test workers) build
    it once, and never replace an image another testbed's guests already run on."""
    return image(f"base-{label(release, arch)}", PACKAGES, (), log, release, arch)


def image(
    kind: str,
    packages: list[str],
    dpkg_opts: tuple[str, ...],
    log=print,
    release: str = DEFAULT_RELEASE,
    arch: str = DEFAULT_ARCH,
) -> Path:
    """The cached rootfs `kind`-<recipe hash> of the base recipe with these packages (the GPU
    node's image adds what its recipe installs: servefleet_dev.testbed.gpunode)."""
    images = cache_subdir("testbed/images")
    target = images / f"{kind}-{recipe_hash(release, arch, packages, dpkg_opts)}"
    if (target / ".complete").exists():
        return target
    if emulated(arch):  # mmdebstrap runs the image's maintainer scripts through it
        binfmt.ensure(arch, log)
    with cache_lock("testbed-image"):
        if (target / ".complete").exists():  # built by another caller while we waited
            return target
        _build(images, target, packages, dpkg_opts, kind, release, arch, log)
    return target


def _build(
    images: Path,
    target: Path,
    packages: list[str],
    dpkg_opts: tuple[str, ...],
    kind: str,
    release: str,
    arch: str,
    log,
) -> None:
    log(f"building testbed image {target.name} with mmdebstrap")
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=images))
    hooks = []
    for ca in _ca_files():
        hooks.append(f"--customize-hook=copy-in {ca} /usr/local/share/ca-certificates/")
    hooks += [f"--customize-hook={cmd}" for cmd in CUSTOMIZE]
    try:
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                f"--architectures={arch}",
                f"--include={','.join(packages)}",
                *[f"--dpkgopt={o}" for o in dpkg_opts],
                *hooks,
                release,
                str(tmp / "rootfs"),
                MIRROR,
            ],
            check=True,
        )
        (tmp / "rootfs" / ".complete").touch()
        if target.exists():
            shutil.rmtree(target)
        (tmp / "rootfs").rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    in_use = _mounted_lowerdirs()
    for old in images.iterdir():  # old recipes are dead weight, unless a guest runs on one
        if of_kind(kind, old.name) and old != target and str(old) not in in_use:
            shutil.rmtree(old, ignore_errors=True)
