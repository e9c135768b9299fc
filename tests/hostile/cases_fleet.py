"""Malformed operator fleet files (inventory/fleet.yml) fed to
servefleet.fleet.inventory.load_fleet(path).

A refusal is a FleetError (a DataError) with one line "file: where: problem", raised within
seconds and without eating memory: the two cases that could hang or exhaust memory (a YAML alias
bomb, a 50 MB file) run in a child process with a time limit and an address-space limit. Files
are written to a temporary directory when the case is checked.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import traceback
from pathlib import Path

from servefleet.core import host_keys
from servefleet.fleet.inventory import FleetError, load_fleet
from tests.hostile.cases_gguf import scratch
from tests.hostile.table import harmless, refused

CATEGORY = "fleet.yml files"
CHILD_TIMEOUT_S = 15
CHILD_MEMORY_BYTES = 1 << 30

CLEAN = """\
hosts:
  - name: spark-01
    role: spark
    ssh_hostname: 10.0.0.11
    ssh_user: ops
    ssh_port: 22
    sudo: true
    data:
      model: agentworld
  - name: depot-01
    role: depot
    ssh_hostname: 10.0.0.2
    ssh_user: ops
    ssh_port: 22
"""


def load(content: str | bytes):
    """load_fleet() on a fleet.yml holding content: (hosts, None) or (None, the error line)."""
    from servefleet.fleet.inventory import FleetError, load_fleet

    with scratch() as tmp:
        path = tmp / "fleet.yml"
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        try:
            return load_fleet(path), None
        except FleetError as exc:
            return None, str(exc)
        except Exception:  # noqa: BLE001 - anything but a FleetError is the failure to report
            return None, traceback.format_exc()


def fleet_refusal(content: str | bytes):
    def attempt():
        hosts, error = load(content)
        if error is None:
            return None
        assert "\n" not in error.rstrip("\n") or "Traceback" in error, (
            f"refusal is not one line: {error[:800]!r}"
        )
        return error

    return attempt


def case(name, expected, content):
    return refused(CATEGORY, name, expected, fleet_refusal(content))


_CHILD = """
import json, sys, traceback
from servefleet.fleet.inventory import FleetError, load_fleet
try:
    load_fleet(sys.argv[1])
    print(json.dumps({"accepted": True}))
except FleetError as exc:
    print(json.dumps({"refused": str(exc)}))
except BaseException:
    print(json.dumps({"traceback": traceback.format_exc()}))
"""


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


def child_refusal(write):
    """attempt() in a child process limited to CHILD_TIMEOUT_S and 1 GiB: write(path) builds the
    file; a hang or a blown memory limit is a failure, not a stuck test run."""

    def attempt():
        with scratch() as tmp:
            path = tmp / "fleet.yml"
            write(path)
            try:
                done = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(path)],
                    capture_output=True,
                    text=True,
                    timeout=CHILD_TIMEOUT_S,
                    preexec_fn=_limit_memory,
                )
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"load_fleet still running after {CHILD_TIMEOUT_S} s"
                ) from None
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines, f"child exited {done.returncode} without a result: {done.stderr[-1500:]}"
        result = json.loads(lines[-1])
        if "accepted" in result:
            return None
        return result.get("refused") or result["traceback"]

    return attempt


def _alias_bomb(path: Path):
    """Billion laughs: 9**9 leaves behind a host name, ~1 KiB of YAML."""
    lines = [
        "hosts:",
        "  - name: spark-01",
        "    role: spark",
        "    data:",
        '      l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    lines += [f"      l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
    lines += ["  - name: *l9", "    role: spark"]
    path.write_text("\n".join(lines) + "\n")


def _huge_file(path: Path):
    """50 MB: a valid fleet followed by comment lines (nothing a fleet file needs)."""
    with open(path, "w") as f:
        f.write(CLEAN)
        block = ("# " + "x" * 98 + "\n") * 10_000  # 1 MB
        for _ in range(50):
            f.write(block)


def _entry(**fields) -> str:
    """A fleet with one entry: name spark-01, role spark, then `fields` as YAML lines."""
    body = "".join(f"    {k}: {v}\n" for k, v in fields.items())
    return "hosts:\n  - name: spark-01\n    role: spark\n" + body


def _harmless_same(content: str):
    def check():
        clean, error = load(CLEAN)
        assert error is None, error
        other, error = load(content)
        assert error is None, error
        strip = [(h.name, h.role, h.connection, h.data) for h in clean]
        assert [(h.name, h.role, h.connection, h.data) for h in other] == strip

    return check


ANCHORED = """\
hosts:
  - name: spark-01
    role: spark
    ssh_hostname: 10.0.0.11
    ssh_user: &user ops
    ssh_port: &port 22
    sudo: true
    data: {model: agentworld}
  - name: depot-01
    role: depot
    ssh_hostname: 10.0.0.2
    ssh_user: *user
    ssh_port: *port
"""

CASES = [
    case("bytes that are not UTF-8", "not UTF-8 (byte 8)", b"hosts: [\xff\xfe]\n"),
    case("duplicate top-level key", "duplicate key 'hosts'", "hosts: []\nhosts: []\n"),
    case(
        "duplicate key inside an entry",
        "duplicate key 'role'",
        "hosts:\n  - name: spark-01\n    role: spark\n    role: depot\n",
    ),
    case("empty file", "empty; expected a mapping with a 'hosts' list", ""),
    case("only comments", "empty; expected a mapping", "# fleet\n# nothing yet\n"),
    case(
        "a YAML list at top level",
        "top level: expected a mapping with a 'hosts' list",
        "- name: spark-01\n  role: spark\n",
    ),
    case(
        "hosts is a mapping",
        "top level: expected a mapping with a 'hosts' list",
        "hosts:\n  spark-01: {role: spark}\n",
    ),
    case(
        "an entry that is a string", "hosts[0]: expected a mapping, got str", "hosts: [spark-01]\n"
    ),
    case(
        "unknown entry key", "unknown keys ['rol']", "hosts:\n  - name: spark-01\n    rol: spark\n"
    ),
    case(
        "unknown entry keys of mixed types (1 and null)",
        "a key of type int: expected a string",
        _entry(**{"1": "x", "~": "y"}),
    ),
    case(
        "bad role",
        "'role' = 'gpu': expected one of spark, rtx4090, depot",
        "hosts:\n  - name: spark-01\n    role: gpu\n",
    ),
    case(
        "name with spaces",
        "'name' = 'spark 01': expected a host name",
        "hosts:\n  - name: spark 01\n    role: spark\n",
    ),
    case(
        "name with a newline",
        "'name' = 'spark\\n01': expected a host name",
        'hosts:\n  - name: "spark\\n01"\n    role: spark\n',
    ),
    case(
        "name with shell characters",
        "'name' = 'spark;reboot': expected a host name",
        "hosts:\n  - name: spark;reboot\n    role: spark\n",
    ),
    case(
        "name starting with a dash (an ssh option)",
        "'name' = '-oProxyCommand=x'",
        "hosts:\n  - name: -oProxyCommand=x\n    role: spark\n",
    ),
    case(
        "duplicate host names",
        "hosts[1] (spark-01): duplicate name",
        "hosts:\n  - {name: spark-01, role: spark}\n  - {name: spark-01, role: depot}\n",
    ),
    case("ssh_port 0", "'ssh_port' = 0: expected 1-65535", _entry(ssh_port=0)),
    case("ssh_port 70000", "'ssh_port' = 70000: expected 1-65535", _entry(ssh_port=70000)),
    case('ssh_port "22" (a string)', "'ssh_port' = '22': expected int", _entry(ssh_port='"22"')),
    case("ssh_port true", "'ssh_port' = True: expected int", _entry(ssh_port="true")),
    case(
        "ssh_hostname with a space",
        "expected a value without spaces",
        _entry(ssh_hostname='"10.0.0.1 -oProxyCommand=x"'),
    ),
    case('sudo "yes" (a string)', "'sudo' = 'yes': expected true or false", _entry(sudo='"yes"')),
    case(
        'testbed "yes" (a string)',
        "'testbed' = 'yes': expected true or false",
        _entry(testbed='"yes"'),
    ),
    case("testbed 1", "'testbed' = 1: expected true or false", _entry(testbed="1")),
    case("data a list", "'data' is list: expected a mapping", _entry(data="[model]")),
    case("data false", "'data' is bool: expected a mapping", _entry(data="false")),
    case("data setting ssh_user", "'data' sets ['ssh_user']", _entry(data="{ssh_user: root}")),
    case("data setting _sudo", "'data' sets ['_sudo']", _entry(data="{_sudo: true}")),
    case(
        "data with a non-string key",
        "refused at line 4: a key of type int: expected a string key",
        _entry(data="{1: x}"),
    ),
    case("tabs for indentation", "not valid YAML at line 2", "hosts:\n\t- name: spark-01\n"),
    case(
        "a !!python/object tag",
        "could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'",
        "hosts: !!python/object/apply:os.system ['true']\n",
    ),
    case("a NUL byte", "refused at line 2: U+0000 (a control character)", "hosts: []\n\0\n"),
    refused(
        CATEGORY,
        "YAML alias bomb (billion laughs) in a host name",
        "YAML nodes",
        child_refusal(_alias_bomb),
    ),
    refused(CATEGORY, "a 50 MB file", "larger than", child_refusal(_huge_file)),
    harmless(
        CATEGORY,
        "a UTF-8 byte order mark, comments and blank lines",
        "the hosts are identical to the clean file's",
        _harmless_same("\ufeff# the fleet\n\n" + CLEAN.replace("\n", "  # note\n\n", 3)),
    ),
    harmless(
        CATEGORY,
        "plain anchors and aliases for shared values",
        "the hosts are identical to the clean file's",
        _harmless_same(ANCHORED),
    ),
    case(
        "a null key (~) in data", "a key of type null: expected a string key", _entry(data="{~: x}")
    ),
    case("a boolean key (yes:) in an entry", "a key of type bool", _entry(yes="x")),
    case(
        "a list as the top-level key", "refused at line 1: a key of type seq", "? [hosts]\n: []\n"
    ),
    case(
        "a mapping as a key in ssh_paramiko_connect_kwargs",
        "a key of type map",
        _entry(ssh_paramiko_connect_kwargs="{? {a: 1} : 2}"),
    ),
    case(
        "5,000 nested [ in data (10 KB)",
        "nested more than 32 levels deep",
        _entry(data="{x: " + "[" * 5000 + "}"),
    ),
    refused(
        CATEGORY,
        "a FIFO named fleet.yml (would wait for a writer)",
        "is a FIFO",
        child_refusal(lambda path: os.mkfifo(path)),
    ),
    harmless(
        CATEGORY,
        "quoted and !!str-tagged keys, and nesting 20 levels deep in an x- key",
        "the hosts are identical to the clean file's",
        _harmless_same(
            "x-deep: "
            + "[" * 20
            + "]" * 20
            + '\n"hosts":\n'
            + CLEAN.split("hosts:\n", 1)[1].replace("    role:", "    !!str role:")
        ),
    ),
]


# Host-key checking switched off, any way at all: every one prints the warning, naming the key.
def _warns(name: str, data: dict, key: str):
    def check():
        host = "weak-" + str(abs(hash(name)) % 10**6)
        host_keys._warned.discard(host)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            for _ in range(2):
                host_keys.warn(host, data, lambda key: "fleet.yml")
        assert err.getvalue().count(f"SSH host-key checking is OFF for {host} ({key}") == 1, (
            err.getvalue()
        )

    return harmless(CATEGORY, f"host keys: {name}", f"warned once, naming {key}", check)


CASES += [
    _warns(
        "strict checking 'no'",
        {"ssh_strict_host_key_checking": "no"},
        "ssh_strict_host_key_checking",
    ),
    _warns(
        "strict checking 'OFF'",
        {"ssh_strict_host_key_checking": "OFF"},
        "ssh_strict_host_key_checking",
    ),
    _warns(
        "strict checking False",
        {"ssh_strict_host_key_checking": False},
        "ssh_strict_host_key_checking",
    ),
    _warns(
        "strict checking 0", {"ssh_strict_host_key_checking": 0}, "ssh_strict_host_key_checking"
    ),
    _warns(
        "strict checking ''", {"ssh_strict_host_key_checking": ""}, "ssh_strict_host_key_checking"
    ),
    _warns(
        "strict checking ' No '",
        {"ssh_strict_host_key_checking": " No "},
        "ssh_strict_host_key_checking",
    ),
    _warns("known_hosts /dev/null", {"ssh_known_hosts_file": "/dev/null"}, "ssh_known_hosts_file"),
    _warns("known_hosts /dev/zero", {"ssh_known_hosts_file": "/dev/zero"}, "ssh_known_hosts_file"),
    _warns(
        "known_hosts /proc/self/fd/0",
        {"ssh_known_hosts_file": "/proc/self/fd/0"},
        "ssh_known_hosts_file",
    ),
    _warns("known_hosts a directory", {"ssh_known_hosts_file": "/etc"}, "ssh_known_hosts_file"),
    _warns("known_hosts ''", {"ssh_known_hosts_file": ""}, "ssh_known_hosts_file"),
]


# --- #27's fleet.yml single cases: refused with the line or the entry, the file unchanged -------


def unchanged_refusal(content: str | bytes):
    """fleet_refusal, asserting the file is byte for byte what was written afterwards."""

    def attempt():
        raw = content.encode() if isinstance(content, str) else content
        with scratch() as tmp:
            path = tmp / "fleet.yml"
            path.write_bytes(raw)
            try:
                load_fleet(path)
                error = None
            except FleetError as exc:
                error = str(exc)
            assert path.read_bytes() == raw and [p.name for p in tmp.iterdir()] == ["fleet.yml"]
        assert error is None or "\n" not in error, error
        return error

    return attempt


def single(name, expected, content):
    return refused(CATEGORY, name, expected, unchanged_refusal(content))


TWO = "hosts:\n  - {name: spark-01, role: spark}\n  - {name: %s, role: spark}\n"

CASES += [
    single(
        "ssh_port: 22:00 (base 60)",
        "'22:00' is read by YAML 1.1 as the integer 1320",
        _entry(ssh_port="22:00"),
    ),
    single(
        "service_port: 010 (octal)",
        "'010' is read by YAML 1.1 as the integer 8",
        _entry(data="{service_port: 010}"),
    ),
    single(
        "ssh_port: 0x16", "'0x16' is read by YAML 1.1 as the integer 22", _entry(ssh_port="0x16")
    ),
    single("ssh_port: 2_2", "'2_2' is read by YAML 1.1 as the integer 22", _entry(ssh_port="2_2")),
    single(
        "ssh_port: 0b10110",
        "'0b10110' is read by YAML 1.1 as the integer 22",
        _entry(ssh_port="0b10110"),
    ),
    single(
        "a gate threshold of .inf",
        "'.inf' is read by YAML 1.1 as the number inf",
        _entry(data="{perf_gate_decode_drop_pct: .inf}"),
    ),
    single(
        "a gate threshold of 1:30.5 (base 60)",
        "'1:30.5' is read by YAML 1.1 as the number",
        _entry(data="{perf_gate_decode_drop_pct: 1:30.5}"),
    ),
    single(
        "U+2028 ends a comment, the key after it is read",
        "refused at line 4: U+2028",
        _entry(ssh_port="22  # was 2222\u2028    ssh_user: root"),
    ),
    single("U+0085 ends a comment", "refused at line 4: U+0085", _entry(sudo="true # x\u0085")),
    single("U+2029 in a value", "refused at line 4: U+2029", _entry(ssh_user="ops\u2029")),
    single("a lone CR", "refused at line 4: U+000D", _entry(ssh_user="ops\rssh_port: 1")),
    single(
        "a right-to-left override in a comment",
        "refused at line 2: U+202E (a bidi control",
        "hosts:\n  # \u202e}depot :elor{\n  - {name: spark-01, role: spark}\n",
    ),
    single(
        "a DEL in ssh_hostname",
        "expected a value without spaces or control characters",
        _entry(ssh_hostname='"10.0.0.1\\x7f"'),
    ),
    single(
        "a C1 control in ssh_user",
        "expected a value without spaces or control characters",
        _entry(ssh_user='"ops\\x9b"'),
    ),
    single(
        "a depot hostname starting with '-'",
        "'ssh_hostname' = '-oProxyCommand=sh': expected",
        "hosts:\n  - {name: depot-01, role: depot, ssh_hostname: -oProxyCommand=sh}\n",
    ),
    single(
        "ssh_user starting with '-'",
        "'ssh_user' = '-lroot': expected a user name",
        _entry(ssh_user="-lroot"),
    ),
    single(
        "an ssh_key path starting with '-'",
        "'ssh_key' = '-i/etc/shadow': expected",
        _entry(ssh_key="-i/etc/shadow"),
    ),
    single(
        "ssh_key of ~nosuchuser",
        "~user names no user here",
        _entry(ssh_key="~nosuchuser-servefleet/key"),
    ),
    single(
        "host names that differ only in case",
        "the same host as hosts[0] (spark-01)",
        TWO % "SPARK-01",
    ),
    single(
        "host names that differ by a trailing dot",
        "the same host as hosts[0] (spark-01)",
        TWO % "spark-01.",
    ),
]
