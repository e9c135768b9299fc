"""Host-key checking (#27 rule 5): switched off anywhere pyinfra reads it, it is warned once per
host, naming where (core/host_keys.py); a known_hosts file is read as OpenSSH reads it
(core/known_hosts.py), so a crafted line pins no key for the depot that `ssh-keygen -F` would
not find, and a pattern of many `*` is answered at once.

Each case writes its files (an OpenSSH client config, a known_hosts file) in a scratch
directory, checks the warning or the refusal, and that the files are unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import subprocess
import time
from pathlib import Path

from servefleet.core import host_keys
from servefleet.core.known_hosts import PinError, pinned_keys
from tests.hostile.cases_gguf import scratch
from tests.hostile.table import harmless, refused

CATEGORY = "host keys"
WARNING = "SSH host-key checking is OFF for "


def digest(tmp: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp.rglob("*") if p.is_file()
    }


def warned(data: dict, config: str = "", source: str = "--data", include: str | None = None):
    """The one warning host_keys.warn prints for a host with `data` (and an OpenSSH config of
    `config`, written for the case, which may Include a second file holding `include`); None
    when it printed none."""

    def attempt():
        with scratch() as tmp:
            (tmp / "ssh_config").write_text(config.replace("{tmp}", str(tmp)))
            if include is not None:
                (tmp / "more.conf").write_text(include)
            before = digest(tmp)
            name = f"node-{hashlib.sha256(repr((data, config)).encode()).hexdigest()[:8]}"
            host_keys._warned.discard(name)
            err = io.StringIO()
            full = {"ssh_hostname": "10.9.8.7", "ssh_config_file": str(tmp / "ssh_config"), **data}
            with contextlib.redirect_stderr(err):
                for _ in range(3):  # once per host and process, however often it is loaded
                    host_keys.warn(name, full, lambda key: source)
            assert digest(tmp) == before, "a file changed"
        lines = err.getvalue().splitlines()
        if not lines:
            return None
        assert len(lines) == 1 and lines[0].count(WARNING + name) == 1, lines
        return lines[0]

    return attempt


def warns(name: str, expected: str, data: dict, config: str = "", **kw):
    return refused(CATEGORY, name, expected, warned(data, config, **kw))


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIrYhqzwYR7ylhrqwirGhOuqk9SlRaXkqElwR3boWFC3"


def no_pin(line: bytes, name: str = "depot"):
    """A known_hosts file of one crafted line: pinned_keys finds no key for the depot (and
    ssh-keygen -l -F, OpenSSH's own reader, finds no key either)."""

    def attempt():
        with scratch() as tmp:
            path = tmp / "known_hosts"
            path.write_bytes(line.replace(b"KEY", KEY.encode()))
            before = digest(tmp)
            found = subprocess.run(
                ["ssh-keygen", "-l", "-F", name, "-f", str(path)], capture_output=True
            ).stdout
            assert b"found" not in found, f"OpenSSH finds a key: {found!r}"
            try:
                pinned_keys(str(path), [name])
            except PinError as exc:
                return str(exc)
            finally:
                assert digest(tmp) == before, "a file changed"
        return None

    return attempt


def _silent(data: dict, config: str) -> None:
    assert warned(data, config)() is None


def stars_fast():
    with scratch() as tmp:
        path = tmp / "known_hosts"
        path.write_text("*a" * 60 + "b " + KEY + "\n")
        started = time.monotonic()
        try:
            pinned_keys(str(path), ["a" * 50_000])
        except PinError as exc:
            took = time.monotonic() - started
            assert took < 2, f"{took:.1f} s"
            return str(exc)
    return None


CASES = [
    warns(
        "--data strict checking no",
        "ssh_strict_host_key_checking: no, --data",
        {"ssh_strict_host_key_checking": "no"},
    ),
    warns(
        "--data strict checking off",
        "ssh_strict_host_key_checking: off, --data",
        {"ssh_strict_host_key_checking": "off"},
    ),
    warns(
        "--data known_hosts /dev/null",
        "ssh_known_hosts_file: /dev/null (keeps no key)",
        {"ssh_known_hosts_file": "/dev/null"},
    ),
    warns(
        "API override data: known_hosts /dev/stdin",
        "ssh_known_hosts_file: /dev/stdin",
        {"ssh_known_hosts_file": "/dev/stdin"},
        source="the caller's override data",
    ),
    warns(
        "ssh config: UserKnownHostsFile /dev/null for every host",
        "UserKnownHostsFile /dev/null (keeps no key)",
        {},
        "Host *\n  UserKnownHostsFile /dev/null\n",
    ),
    warns(
        "ssh config: the node's address matched by a wildcard",
        "UserKnownHostsFile /dev/null",
        {},
        "Host 10.9.8.*\n  UserKnownHostsFile /dev/null\n",
    ),
    warns(
        "ssh config: the key=value form and a keyword in lower case",
        "UserKnownHostsFile /dev/null",
        {},
        "host 10.9.8.7\n  userknownhostsfile=/dev/null\n",
    ),
    warns(
        "ssh config: /dev/null beside a real file",
        "UserKnownHostsFile /dev/null ~/.ssh/known_hosts",
        {},
        "Host *\n  UserKnownHostsFile /dev/null ~/.ssh/known_hosts\n",
    ),
    warns(
        "ssh config: set in an Included file",
        "UserKnownHostsFile /dev/null",
        {},
        "Include {tmp}/more.conf\n",
        include="Host *\n  UserKnownHostsFile /dev/null\n",
    ),
    warns(
        "ssh config: a directory as UserKnownHostsFile",
        "UserKnownHostsFile /etc (keeps no key)",
        {},
        "Host *\n  UserKnownHostsFile /etc\n",
    ),
    warns(
        "two ways at once: both named in the one warning",
        "ssh_strict_host_key_checking: no, --data; ssh_known_hosts_file: /dev/null",
        {"ssh_strict_host_key_checking": "no", "ssh_known_hosts_file": "/dev/null"},
    ),
    harmless(
        CATEGORY,
        "ssh config with UserKnownHostsFile /dev/null for another host only (control)",
        "no warning: the node's connection keeps checking",
        lambda: _silent({}, "Host 10.0.0.*\n  UserKnownHostsFile /dev/null\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: U+2028 before the depot's name",
        "holds no key for depot",
        no_pin(b"evil\xe2\x80\xa8depot KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: U+0085 before the depot's name",
        "holds no key for depot",
        no_pin(b"evil\xc2\x85depot KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: a form feed before the depot's name",
        "holds no key for depot",
        no_pin(b"evil\x0cdepot KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: a lone CR before the depot's name",
        "holds no key for depot",
        no_pin(b"evil\rdepot KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: NBSP between name and key",
        "holds no key for depot",
        no_pin(b"depot\xc2\xa0KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: a form feed between name and key",
        "holds no key for depot",
        no_pin(b"depot\x0cKEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: a vertical tab before the depot's name",
        "holds no key for depot",
        no_pin(b"evil\x0bdepot KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: a NUL before the depot's name (C ends the line)",
        "holds no key for depot",
        no_pin(b"\x00depot KEY\n"),
    ),
    refused(
        CATEGORY,
        "known_hosts: a capital the pattern would lower in Unicode only",
        "holds no key for dep\u00f6t",
        no_pin("DEP\u00d6T KEY\n".encode(), "dep\u00f6t"),
    ),
    refused(
        CATEGORY,
        "known_hosts: 60 '*' against a 50,000-character name",
        "holds no key for",
        stars_fast,
    ),
]
