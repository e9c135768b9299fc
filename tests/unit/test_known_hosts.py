"""The depot's host key nodes pin comes from the operator's known_hosts (servefleet.core.
known_hosts, servefleet.operations.depot.locate), never from the depot itself.

The keys and the hashed lines are real: ssh-keygen -t ed25519 / -t ecdsa, and ssh-keygen -H
(OpenSSH 9.2) of a file naming [10.77.0.5]:2222.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host

from servefleet.core.errors import DataError
from servefleet.core.known_hosts import (
    PinError,
    host_name,
    keys_for,
    names_host,
    pinned_keys,
    valid_key,
)
from servefleet.operations import depot as depot_ops
from servefleet_dev.testbed.material import load as group_data

ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIrYhqzwYR7ylhrqwirGhOuqk9SlRaXkqElwR3boWFC3"
EC = (
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPL/yP22vjoWXiTGiRnJ"
    "1jTKde87vT99F2GAypNFak7QXEbjBxwsz+L4FSiD9TJ7nHqQC6LlE1on5xMFzx1d2uY="
)
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPiMnd5kCqJe9KXRJPiOfH2FOUH0aHaVAImtncl+/r52"
OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHfPkJCSQXt+gX8uWjl/+cn5BJvcU3Nc5I3p3Bsw7Q1A"
CA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ1HwUhoMzeHHfn6sMkvM+FuZlWET586394UgtynClDw"
HASHED = (
    f"|1|1WMk5CWmYMAZ6EvCBUHOhwaCYSs=|MIWry/I4K6bHXKxPl97SkwXBeqw= {ED}\n"
    f"|1|Yh5/g3+wZRQG+FsPlKEv7jlT8Jk=|dgpC9UKRipJOvLP0HKHwV+y6wzQ= {EC}\n"
)
DEPOT = "[10.77.0.5]:2222"


def test_host_names_as_openssh_looks_them_up():
    assert host_name("10.77.0.5", 22) == "10.77.0.5"
    assert host_name("10.77.0.5", 2222) == DEPOT


def test_hashed_lines_name_their_host_only():
    assert keys_for(HASHED, [DEPOT]) == [ED, EC]
    assert keys_for(HASHED, ["10.77.0.5"]) == []  # port 22 is another name
    assert keys_for(HASHED, ["[10.77.0.5]:2223"]) == []
    assert not names_host("|1|not base64|x", DEPOT)


def test_patterns_negation_markers_and_junk():
    text = "\n".join(
        [
            "# a comment naming [10.77.0.5]:2222 " + OTHER,
            "",
            f"*.example.org,!bad.example.org {OTHER} a comment",
            f"{DEPOT},depot-1 {ED}",
            f"{DEPOT} {ED}",  # the same key twice: once
            f"@cert-authority {DEPOT} {CA}",  # a CA, not a key to pin
            f"{DEPOT} {OLD}",
            f"@revoked * {OLD}",  # revoked: never pinned
            f"{DEPOT} ssh-dss AAAAB3NzaC1kc3MAAACBAP",  # a type OpenSSH no longer takes
            f"{DEPOT} ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==",  # blob of another type
            f"{DEPOT} ssh-ed25519 %%%notbase64",
            f"{DEPOT}",  # no key at all
        ]
    )
    assert keys_for(text, [DEPOT]) == [ED]
    assert keys_for(text, ["depot-1"]) == [ED]
    assert keys_for(text, ["a.EXAMPLE.org"]) == [OTHER]
    assert keys_for(text, ["bad.example.org"]) == []
    assert valid_key(*ED.split()) and valid_key(*EC.split())
    assert not valid_key("ssh-rsa", ED.split()[1])


@pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="no ssh-keygen")
def test_the_same_names_match_as_openssh_finds_them(tmp_path):
    """Differential: ssh-keygen -F (OpenSSH's own host matching) finds a key for a name
    exactly when keys_for does."""
    text = (
        f"*.example.org,!bad.example.org {OTHER}\n10.0.0.? {OTHER}\n{DEPOT},depot-1 {ED}\n" + HASHED
    )
    (tmp_path / "kh").write_text(text)
    for name in (
        "a.example.org",
        "bad.example.org",
        "A.Example.Org",
        "10.0.0.7",
        "10.0.0.77",
        DEPOT,
        "depot-1",
        "10.77.0.5",
        "[10.77.0.5]:22",
        "depot-2",
    ):
        found = subprocess.run(
            ["ssh-keygen", "-F", name, "-f", str(tmp_path / "kh")], capture_output=True, text=True
        ).stdout
        assert bool(keys_for(text, [name])) == ("found" in found), name


def _keys(n: int) -> list[str]:
    """n distinct real ed25519 public keys (`type base64`), made by ssh-keygen."""
    out = []
    for i in range(n):
        path = Path(tempfile.mkdtemp()) / f"k{i}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        out.append(" ".join(path.with_suffix(".pub").read_text().split()[:2]))
    return out


K = _keys(8) if shutil.which("ssh-keygen") else []


def _fingerprint(key: str) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-f", "-"], input=key + "\n", capture_output=True, text=True
    ).stdout
    return out.split()[1]  # "256 SHA256:... no comment (ED25519)"


FINGERPRINTS = {k: _fingerprint(k) for k in K}


def _openssh_finds(path: Path, name: str) -> set[str]:
    """The keys `ssh-keygen -l -F name -f path` finds (it parses each matching line's key, as
    ssh does, and prints its fingerprint)."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-F", name, "-f", str(path)], capture_output=True
    ).stdout.decode("latin-1")
    return {k for k, fp in FINGERPRINTS.items() if fp in out}


# Lines that Python's splitlines()/split() would cut where OpenSSH does not: each once pinned a
# key for the depot that `ssh-keygen -F depot` does not associate with it.
CRAFTED = {
    "U+2028 as a line end": b"evil\xe2\x80\xa8depot %(k)s\n",
    "U+0085 as a line end": b"evil\xc2\x85depot %(k)s\n",
    "a form feed as a line end": b"evil\x0cdepot %(k)s\n",
    "a lone CR as a line end": b"evil\rdepot %(k)s\n",
    "a vertical tab as a line end": b"evil\x0bdepot %(k)s\n",
    "a file separator (0x1c) as a line end": b"evil\x1cdepot %(k)s\n",
    "NBSP between the name and the key": b"depot\xc2\xa0%(k)s\n",
    "a form feed between the name and the key": b"depot\x0c%(k)s\n",
    "U+2028 inside the pattern list": b"depot-x,\xe2\x80\xa8depot %(k)s\n",
    "a NUL before the name (C ends the line there)": b"\x00depot %(k)s\n",
    "a NUL inside the key type": b"depot ssh-\x00%(k)s\n",
    "a CR before the name": b"\rdepot %(k)s\n",
    "a non-ASCII capital the pattern lowers (\xc3\x96)": b"DEP\xc3\x96T %(k)s\n",
}
ACCEPTED = {
    "a CRLF line end": b"depot %(k)s\r\n",
    "a NUL after the key (C ends the line there)": b"depot %(k)s\x00junk\n",
    "a NUL ends the names, the key is read after it": b"depot\x00 %(k)s\n",
    "a NUL ends the names, the key right after it": b"depot\x00%(k)s\n",
    "a tab between the fields": b"depot\t%(k)s\n",
    "upper case (OpenSSH lowercases)": b"DEPOT %(k)s\n",
    "spaces and tabs before the name": b" \t depot %(k)s\n",
}


@pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="no ssh-keygen")
@pytest.mark.parametrize(
    "line", list(CRAFTED.values()) + list(ACCEPTED.values()), ids=list(CRAFTED) + list(ACCEPTED)
)
def test_lines_split_as_openssh_splits_them(tmp_path, line):
    """Differential: a file of one crafted line among plain ones; for every name, the keys
    keys_for pins are the keys of the lines ssh-keygen -F finds."""
    raw = f"other {K[1]}\n".encode() + line % {b"k": K[0].encode()} + f"depot-x {K[2]}\n".encode()
    (tmp_path / "kh").write_bytes(raw)
    for name in ("depot", "evil", "other", "depot-x", "dep\xf6t", "depöt"):
        assert set(keys_for(raw, [name])) == _openssh_finds(tmp_path / "kh", name), name
    pinned = set(keys_for(raw, ["depot"]))
    assert pinned == ({K[0]} if line in ACCEPTED.values() else set())


def test_sixty_stars_against_a_long_name_take_no_time():
    """A pattern of 60 `*` (each followed by an `a`) against 20,000 `a`s and no final `b`: a
    backtracking match takes exponential time; OpenSSH's answer (no match) comes at once."""
    pattern = "*a" * 60 + "b"
    started = time.monotonic()
    assert not names_host(pattern, "a" * 20_000)
    assert names_host(pattern, "a" * 20_000 + "b")
    assert names_host("*" * 60, "x" * 20_000)
    assert time.monotonic() - started < 2.0


def test_a_file_without_a_key_for_the_depot_is_refused(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(HASHED)
    assert pinned_keys(str(kh), [DEPOT]) == (ED, EC)
    for path, reason in [
        (None, "has no ssh_known_hosts_file"),
        ("", "has no ssh_known_hosts_file"),
        (str(tmp_path / "missing"), "cannot be read (No such file"),
        ("/dev/null", "keeps no key (not a regular file)"),
        (str(tmp_path), "keeps no key (not a regular file)"),
        (str(kh), "holds no key for 10.0.0.9 or depot-9"),
    ]:
        with pytest.raises(PinError, match=re.escape(reason)):
            pinned_keys(path, ["10.0.0.9", "depot-9"] if path == str(kh) else [DEPOT])


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PinError, match="keeps no key"):
        pinned_keys(str(fifo), [DEPOT])


# --- locate(): what nodes pin, and the one line when there is nothing pinned ---------------------


def _locate(tmp_path, **depot_entry):
    data = {
        **group_data("all", "depot"),
        "ssh_hostname": "10.77.0.5",
        "ssh_port": 2222,
        **depot_entry,
    }
    depot = SimpleNamespace(name="depot-1", data=data)
    inventory = SimpleNamespace(
        get_host=lambda name, default=None: depot if name == "depot-1" else default
    )
    with ctx_host.use(SimpleNamespace(name="spark-1", inventory=inventory)):
        return depot_ops.locate("depot-1")


def test_nodes_pin_the_operators_keys_under_the_name_they_reach_the_depot_by(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{DEPOT} {ED}\n{DEPOT} {EC}\n")
    where = _locate(tmp_path, ssh_known_hosts_file=str(kh), ssh_strict_host_key_checking="yes")
    assert where.host_keys == (ED, EC) and where.ssh_name == DEPOT
    # Nodes reach it on the private network: the operator's entry (its own name) is the
    # machine's key, written under the private address.
    private = _locate(
        tmp_path,
        ssh_known_hosts_file=str(kh),
        ssh_strict_host_key_checking="yes",
        depot_address="192.168.50.2",
    )
    assert private.host_keys == (ED, EC) and private.ssh_name == "[192.168.50.2]:2222"


@pytest.mark.parametrize(
    "entry, reason",
    [
        ({}, "(it has no ssh_known_hosts_file)"),
        (
            {"ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "yes"},
            "keeps no key",
        ),
        (
            {"ssh_known_hosts_file": "OTHER", "ssh_strict_host_key_checking": "yes"},
            "holds no key for [10.77.0.5]:2222",
        ),
        ({"ssh_known_hosts_file": "PINNED"}, "ssh_strict_host_key_checking is not set"),
        (
            {"ssh_known_hosts_file": "PINNED", "ssh_strict_host_key_checking": "accept-new"},
            "ssh_strict_host_key_checking is 'accept-new'",
        ),
    ],
    ids=["no-file", "dev-null", "no-entry", "strict-unset", "accept-new"],
)
def test_a_depot_without_a_pinned_key_stops_the_run_with_one_line(tmp_path, entry, reason):
    (tmp_path / "pinned").write_text(f"{DEPOT} {ED}\n")
    (tmp_path / "other").write_text(f"10.77.0.6 {OTHER}\n")
    files = {"PINNED": str(tmp_path / "pinned"), "OTHER": str(tmp_path / "other")}
    if entry.get("ssh_known_hosts_file") in files:
        entry = {**entry, "ssh_known_hosts_file": files[entry["ssh_known_hosts_file"]]}
    with pytest.raises(DataError) as err:
        _locate(tmp_path, **entry)
    message = str(err.value)
    assert "\n" not in message and reason in message, message
    assert message.startswith(
        "invalid data for host spark-1: depot_host depot-1 has no pinned SSH host key"
    )
    assert "set ssh_known_hosts_file to a file holding its key for [10.77.0.5]:2222" in message
    assert "ssh_strict_host_key_checking: yes" in message
    assert message.endswith("nothing was changed")
