"""How a testbed host names its Debian release and architecture (servefleet_dev.testbed.
platforms), what the state records, and that each image recipe hashes apart (release and
architecture are part of it). Nothing here boots a guest: tests/e2e/test_testbed.py does."""

import json
import os
import subprocess

import pytest
from rich.console import Console

from servefleet_dev.cli.testbed import print_status
from servefleet_dev.testbed import binfmt, emulation, image, lifecycle, platforms
from servefleet_dev.testbed.platforms import HostSpec
from servefleet_dev.testbed.state import HostRecord, TestbedState, load_state, save_state


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A testbed state of its own (instance 0 under a temporary cache)."""
    monkeypatch.setenv("SERVEFLEET_CACHE", str(tmp_path))
    monkeypatch.delenv("SERVEFLEET_TESTBED_INSTANCE", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("spark-1", HostSpec("spark-1")),
        ("spark-1@trixie", HostSpec("spark-1", "trixie")),
        ("spark-2@arm64", HostSpec("spark-2", None, "arm64")),
        ("spark-2@bookworm-arm64", HostSpec("spark-2", "bookworm", "arm64")),
        ("rtx4090-1@arm64-trixie", HostSpec("rtx4090-1", "trixie", "arm64")),
        ("depot-10@trixie-amd64", HostSpec("depot-10", "trixie", "amd64")),
    ],
)
def test_a_name_may_carry_release_and_architecture(spec, expected):
    assert platforms.parse(spec) == expected


@pytest.mark.parametrize(
    "spec",
    ["spark-1@", "spark-1@sid", "spark-1@trixie-trixie", "spark-1@arm64-amd64", "spark-1@i386"],
)
def test_an_unknown_or_doubled_suffix_is_refused(spec):
    with pytest.raises(ValueError, match=r"after '@' comes a Debian release \(bookworm, trixie\)"):
        platforms.parse(spec)


def test_names_are_validated_before_anything_starts():
    assert lifecycle._specs(["spark-1", "depot-1@trixie-arm64"]) == [
        HostSpec("spark-1"),
        HostSpec("depot-1", "trixie", "arm64"),
    ]
    with pytest.raises(ValueError, match="must start with a role"):
        lifecycle._specs(["spark-1", "gpu-1@trixie"])  # the role is the name's, not the suffix's
    with pytest.raises(ValueError, match="after '@'"):
        lifecycle._specs(["spark-1@buster"])


def test_a_host_keeps_the_platform_it_was_created_with():
    state = TestbedState(
        hosts={"spark-1": HostRecord("spark-1", "spark", "10.77.0.10", release="trixie")}
    )
    for ok in ("spark-1", "spark-1@trixie", "spark-1@trixie-amd64", "spark-2@arm64"):
        lifecycle._check_platforms(state, lifecycle._specs([ok]))
    for other in ("spark-1@bookworm", "spark-1@arm64"):
        with pytest.raises(ValueError, match="spark-1 exists as trixie-amd64, not .*: rm it first"):
            lifecycle._check_platforms(state, lifecycle._specs([other]))


def test_the_state_records_release_and_arch_and_reads_older_files(cache):
    state = TestbedState(
        hosts={
            "spark-1": HostRecord("spark-1", "spark", "10.77.0.10"),
            "spark-2": HostRecord("spark-2", "spark", "10.77.0.11", release="trixie", arch="arm64"),
        }
    )
    save_state(state)
    back = load_state().hosts
    assert (back["spark-1"].release, back["spark-1"].arch) == ("bookworm", "amd64")
    assert (back["spark-2"].release, back["spark-2"].arch) == ("trixie", "arm64")
    # A state file written before hosts had a platform: its hosts are Debian 12 on amd64.
    raw = json.loads(state.to_json())
    for host in raw["hosts"].values():
        del host["release"], host["arch"]
    (cache / "testbed/state.json").write_text(json.dumps(raw))
    assert {(h.release, h.arch) for h in load_state().hosts.values()} == {("bookworm", "amd64")}


def test_status_shows_release_and_arch(cache):
    save_state(
        TestbedState(
            hosts={"spark-2": HostRecord("spark-2", "spark", "10.77.0.11", None, 22, "trixie")}
        )
    )
    rows = lifecycle.status()
    assert rows == [
        {
            "name": "spark-2",
            "role": "spark",
            "release": "trixie",
            "arch": "amd64",
            "address": "10.77.0.11",
            "systemd": "stopped",
        }
    ]
    console = Console(record=True, width=120)
    print_status(rows, console)
    table = console.export_text()
    assert "release" in table and "arch" in table and "trixie" in table and "amd64" in table


def test_each_release_and_architecture_has_its_own_recipe_hash():
    combos = [(r, a) for r in platforms.RELEASES for a in platforms.ARCHES]
    hashes = {image.recipe_hash(r, a) for r, a in combos}
    assert len(hashes) == len(combos) == 4
    assert image.recipe_hash() == image.recipe_hash("bookworm", "amd64")  # the defaults
    assert image.recipe_hash("trixie", "arm64") == image.recipe_hash("trixie", "arm64")
    # Packages and dpkg options are part of it too (the GPU node's image adds both).
    assert image.recipe_hash("trixie", "amd64", [*image.PACKAGES, "git"]) != image.recipe_hash(
        "trixie", "amd64"
    )
    assert image.recipe_hash("trixie", "amd64", image.PACKAGES, ("--path-exclude=/x",)) != (
        image.recipe_hash("trixie", "amd64")
    )


def test_an_image_replaces_only_older_recipes_of_its_own_kind():
    h = "0123456789abcdef"
    assert image.of_kind("base-trixie-arm64", f"base-trixie-arm64-{h}")
    assert not image.of_kind("base-trixie-amd64", f"base-trixie-arm64-{h}")
    assert not image.of_kind("base-bookworm-amd64", f"base-bookworm-amd64-extra-{h}")
    assert not image.of_kind("base-bookworm-amd64", f"bookworm-{h}")  # older testbeds' image
    assert not image.of_kind("base-bookworm-amd64", f"base-bookworm-amd64-{h}.tmp")
    assert not image.of_kind("gpunode-bookworm", f"base-bookworm-amd64-{h}")


def test_only_a_foreign_architecture_is_emulated():
    machine = os.uname().machine
    assert platforms.emulated("amd64") == (machine != "x86_64")
    assert platforms.emulated("arm64") == (machine != "aarch64")


# Debian 12's /usr/lib/binfmt.d/qemu-aarch64.conf (qemu-user-static 1:7.2+dfsg-7+deb12u18).
DEBIAN_AARCH64 = (
    r":qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00"
    r"\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
    r":/usr/libexec/qemu-binfmt/aarch64-binfmt-P:OPF"
)


def test_the_registration_adds_fix_binary_and_credentials():
    line = binfmt.registration(DEBIAN_AARCH64)
    head, flags = line.rsplit(":", 1)
    assert head == DEBIAN_AARCH64.rsplit(":", 1)[0]  # magic, mask and interpreter as Debian's
    assert sorted(flags) == sorted("OPFC")
    assert binfmt.registration(line) == line  # already there: unchanged
    assert sorted(binfmt.registration(DEBIAN_AARCH64[:-3] + "F").rsplit(":", 1)[1]) == sorted(
        "FCO"
    )  # C needs O
    with pytest.raises(ValueError, match="not a binfmt_misc registration"):
        binfmt.registration("qemu-aarch64 M magic")


def test_an_emulated_guest_is_seeded_around_qemu_users_gaps(tmp_path):
    """Credential settings cleared (qemu-user refuses the clone systemd sets them up in), networkd
    masked (no generic netlink) and host0 set up with ip from the seeded .network file."""
    units = tmp_path / "image/usr/lib/systemd/system"
    units.mkdir(parents=True)
    (units / "systemd-sysusers.service").write_text(
        "[Service]\nLoadCredential=passwd.shell.root\nLoadCredential=sysusers.extra\n"
        "ImportCredential=sysusers.*\n"
    )
    (units / "ssh.service").write_text("[Service]\nExecStart=/usr/sbin/sshd -D\n")
    (units / "systemd-tmpfiles-setup.service").write_text("[Service]\nSetCredential=x:y\n")
    upper = tmp_path / "upper"
    emulation.seed(upper, tmp_path / "image")
    etc = upper / "etc/systemd/system"
    assert sorted(p.name for p in etc.glob("*.d")) == [
        "systemd-sysusers.service.d",
        "systemd-tmpfiles-setup.service.d",
    ]
    assert (etc / "systemd-sysusers.service.d/qemu-user.conf").read_text() == (
        "[Service]\nImportCredential=\nLoadCredential=\n"
    )
    for unit in emulation.NETWORKD_UNITS:
        assert os.readlink(etc / unit) == "/dev/null"
    wants = etc / "multi-user.target.wants" / emulation.NET_UNIT
    assert os.readlink(wants) == f"/etc/systemd/system/{emulation.NET_UNIT}"
    assert f"ExecStart={emulation.NET_SCRIPT}" in (etc / emulation.NET_UNIT).read_text()
    script = upper / emulation.NET_SCRIPT.lstrip("/")
    assert script.stat().st_mode & 0o777 == 0o755
    # The script reads the address the seed wrote for networkd (hosts._seed's format).
    network = tmp_path / "10-host0.network"
    network.write_text("[Network]\nAddress=10.77.0.12/24\nGateway=10.77.0.1\nDNS=10.0.2.3\n")
    fake_ip = tmp_path / "bin/ip"
    fake_ip.parent.mkdir()
    fake_ip.write_text('#!/bin/sh\necho "ip $*"\n')
    fake_ip.chmod(0o755)
    text = script.read_text().replace("/etc/systemd/network/10-host0.network", str(network))
    out = subprocess.run(
        ["sh", "-c", text],
        env={"PATH": f"{fake_ip.parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [
        "ip link set host0 up",
        "ip address replace 10.77.0.12/24 dev host0",
        "ip route replace default via 10.77.0.1",
    ]
