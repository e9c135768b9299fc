"""A real GPU node: the testbed's guest image booted under real systemd on the lent H200.

That machine has no network, no sshd and no systemd, and takes at most 64 MiB a call. So
everything the 4090 recipe needs there is made here and carried in parts
(`python -m servefleet_dev.testbed.gpunode pack`, then tests/device/gpunode.sh):

- the guest's root filesystem: the testbed's image recipe (servefleet_dev.testbed.image) plus
  the OS packages the recipe installs (os_packages, llamacpp_build_packages, read from
  group_data/), so its apt step finds them installed; seeded as one testbed host (host keys,
  the admin's authorized key), sshd on SSH_PORT;
- the operator side: pyinfra, paramiko and servefleet's other dependencies for the image's
  own Python (/opt/sf-operator), run from a chroot of the same tree, which also provides
  Debian's systemd-nspawn;
- what replaces the network for the node: a PEP 503 wheelhouse of the tools venv's pins
  (served on 127.0.0.1:INDEX_PORT), a llama.cpp mirror holding release b9785 (the testbed's
  pin), the local hub with the tiny GGUF that has the field's missing-MTP defect (HUB_PORT).

The guest shares the H200's network namespace (nspawn without --private-network): sshd, the
hub, the index and the service all listen on that machine's loopback.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from servefleet.core.groupdata import load_group
from servefleet.core.paths import cache_subdir
from servefleet.fleet.inventory import groups_of
from servefleet.fleet.nodes import NODE_CLASSES
from servefleet_dev.hub import publish
from servefleet_dev.testbed import hosts, image
from servefleet_dev.testbed.state import HostRecord
from servefleet_dev.testing import llama_src
from servefleet_dev.testing.tiny_models import build_tiny_gguf

NODE = "gpu-node-1"
SSH_PORT = 2022  # the H200's port 22 is free, this machine's may not be: one port for both
HUB_PORT = 8091
INDEX_PORT = 8092
GROUP = "h200_gpu"  # the inventory's file-name group: group_data/h200_gpu.py
# Its pyinfra groups, later data winning: those fleet.yml gives a 4090 (the class's, its engine's;
# inventory.groups_of), then the inventory file's. Named by hand, they once lacked the engine's.
_CLASS = next(n for n in NODE_CLASSES if n.name == "rtx4090")
GROUPS = groups_of(_CLASS.name, _CLASS.engine, GROUP)
PART_BYTES = 60 * 1024**2  # one part per device call (64 MiB with the working tree)
# The guest's docs, manuals and translations are not carried (a smaller tarball, fewer calls).
DPKG_OPTS = (
    "path-exclude=/usr/share/doc/*",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
# Beside the recipe's packages: Debian's systemd-nspawn for the launching chroot (the H200 has
# none), procps for looking inside.
LAUNCH_PACKAGES = ["systemd-container", "procps"]
OPERATOR_DIR = "/opt/sf-operator"  # in the tools chroot only; removed from the guest's copy


def recipe_data() -> dict:
    """The data a GPU node of that group gets (later groups win), as pyinfra layers it."""
    out: dict = {}
    for name in ("all", *GROUPS):
        out.update(load_group(name) or {})
    return out


def packages() -> list[str]:
    """The testbed image's packages plus every Debian package the 4090 recipe installs."""
    data = recipe_data()
    extra = [p for key in ("os_packages", "llamacpp_build_packages") for p in data[key]["debian"]]
    return sorted(set(image.PACKAGES + extra + LAUNCH_PACKAGES))


def node_image(log=print) -> Path:
    return image.image("gpunode-bookworm", packages(), DPKG_OPTS, log)


def tool_pins() -> dict[str, str]:
    """The tools venv's pins of the recipe (base.TOOLS, MODEL_TOOLS, GGUF_TOOLS)."""
    data = recipe_data()
    return {
        "uv": data["uv_version"],
        "huggingface-hub": data["huggingface_hub_version"],
        "gguf": data["llamacpp_gguf_version"],
    }


def _pip_download(dest: Path, requirements: list[str], python_version: str) -> None:
    """Binary wheels for the guest's CPython (x86_64 manylinux), with their dependencies."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "any",
            "--dest",
            str(dest),
            *requirements,
        ],
        check=True,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        },
    )


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def simple_index(wheels: Path, index: Path) -> None:
    """PEP 503 layout: index/<project>/<file> (python -m http.server lists them as links)."""
    for wheel in sorted(wheels.glob("*.whl")):
        project = _normalize(wheel.name.split("-", 1)[0])
        (index / project).mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, index / project / wheel.name)


def _guest_python(rootfs: Path) -> str:
    out = subprocess.run(
        [
            "chroot",
            str(rootfs),
            "python3",
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2])",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def operator_requirements() -> list[str]:
    """servefleet's runtime dependencies, as pyproject.toml states them."""
    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    return list(doc["project"]["dependencies"])


def _seed(rootfs: Path) -> tuple[str, Path]:
    """The guest as one testbed host: its host keys, the testbed key for root and the admin,
    sshd on SSH_PORT. Returns its known_hosts line and the key pair's private half."""
    record = HostRecord(name=NODE, role="rtx4090", address="127.0.0.1", ssh_port=SSH_PORT)
    hosts._seed(rootfs, record.name, record.address, record.ssh_port)
    # Shares the H200's network namespace: no host0 to configure, no resolver to reach.
    (rootfs / "etc/systemd/network/10-host0.network").unlink()
    subprocess.run(
        ["chroot", str(rootfs), "systemctl", "disable", "systemd-networkd"],
        check=True,
        capture_output=True,
    )
    key = (rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    return f"{hosts.known_hosts_name(record)} {key[0]} {key[1]}\n", hosts.ssh_key()


def pack(out: Path, log=print) -> dict:
    """Everything the device run needs, as out/payload.tar.xz split into out/cNN/part (each
    under PART_BYTES) with out/payload.json (sizes and sha256). Returns that manifest."""
    data = recipe_data()
    img = node_image(log)
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpunode-", dir=cache_subdir("testbed")) as tmp:
        stage = Path(tmp) / "payload"
        rootfs = stage / "rootfs"
        stage.mkdir()
        log(f"copying {img.name}")
        subprocess.run(["cp", "-a", str(img), str(rootfs)], check=True)
        (rootfs / ".complete").unlink(missing_ok=True)
        known, key = _seed(rootfs)
        ssh = stage / "ssh"
        ssh.mkdir(mode=0o700)
        shutil.copy2(key, ssh / "id_ed25519")
        shutil.copy2(str(key) + ".pub", ssh / "id_ed25519.pub")
        (ssh / "known_hosts").write_text(known)
        pyver = _guest_python(rootfs)
        log(f"operator packages for the image's Python {pyver}")
        wheels = Path(tmp) / "operator-wheels"
        _pip_download(wheels, operator_requirements(), pyver)
        site = rootfs / OPERATOR_DIR.lstrip("/") / "site"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--target",
                str(site),
                *map(str, sorted(wheels.glob("*.whl"))),
            ],
            check=True,
        )
        log(f"wheelhouse of the tools venv: {tool_pins()}")
        node_wheels = Path(tmp) / "node-wheels"
        _pip_download(node_wheels, [f"{n}=={v}" for n, v in tool_pins().items()], pyver)
        simple_index(node_wheels, stage / "simple")
        log("llama.cpp mirror with the pin")
        mirror = stage / "git" / llama_src.MIRROR_NAME
        got = llama_src.commits(mirror, tags=(data["llamacpp_tag"],))
        if got.get(data["llamacpp_tag"]) != data["llamacpp_commit"]:
            raise RuntimeError(
                f"the mirror holds {got}, group_data/{GROUP}.py pins "
                f"{data['llamacpp_tag']} = {data['llamacpp_commit']}"
            )
        subprocess.run(
            ["git", "--git-dir", str(mirror), "gc", "--quiet", "--aggressive"], check=True
        )
        log("the tiny GGUF with the missing-MTP defect on the hub")
        with tempfile.TemporaryDirectory() as src:
            build_tiny_gguf(Path(src) / data["model_file"], layout="field_missing_mtp")
            publish(stage / "hub", data["model_repo"], src)
        log("compressing")
        tarball = Path(tmp) / "payload.tar.xz"
        subprocess.run(
            [
                "tar",
                "-C",
                str(stage.parent),
                "--numeric-owner",
                "-I",
                "xz -T0 -6",
                "-cf",
                str(tarball),
                "payload",
            ],
            check=True,
        )
        manifest = {
            "sha256": _sha256(tarball),
            "bytes": tarball.stat().st_size,
            "parts": [],
            "known_hosts": known,
            "node": NODE,
        }
        with open(tarball, "rb") as fh:
            index = 0
            while chunk := fh.read(PART_BYTES):
                part = out / f"c{index:02d}" / "part"
                part.parent.mkdir()
                part.write_bytes(chunk)
                manifest["parts"].append(
                    {
                        "path": str(part.relative_to(out)),
                        "sha256": hashlib.sha256(chunk).hexdigest(),
                    }
                )
                index += 1
    (out / "payload.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for index in range(len(manifest["parts"])):  # each call's part knows the whole
        shutil.copy2(out / "payload.json", out / f"c{index:02d}" / "payload.json")
    log(f"{len(manifest['parts'])} parts, {manifest['bytes'] / 2**20:.0f} MiB")
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def main(argv: list[str]) -> int:
    if argv[:1] == ["settings"]:  # for tests/device/gpunode.sh, as shell assignments
        print(
            f"SSH_PORT={SSH_PORT} HUB_PORT={HUB_PORT} INDEX_PORT={INDEX_PORT} "
            f"POLICY={shlex.quote(' '.join(hosts.DEVICE_POLICY_ARGS))}"
        )
        return 0
    if argv[:1] == ["pack"]:
        out = Path(argv[1]) if len(argv) > 1 else Path(".devrun/gpunode")
        pack(out)
        return 0
    print("usage: python -m servefleet_dev.testbed.gpunode pack [OUT]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
