"""inventory/fleet.yml: valid files load into roles; malformed ones name file, entry, problem;
every host's data is validated when the inventory loads, before pyinfra connects anywhere."""

import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.fleet.inventory import FleetError, fleet_groups, load_fleet

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def write(tmp_path, text):
    path = tmp_path / "fleet.yml"
    path.write_text(text)
    return path


def test_shipped_example_fleet_loads(monkeypatch):
    monkeypatch.chdir(REPO)
    hosts = load_fleet("inventory/fleet.yml")
    assert {h.role for h in hosts} == {"spark", "rtx4090"}
    groups = fleet_groups("inventory/spark.py")
    assert list(groups) == ["spark", "vllm"]  # the class, then its engine: engine data wins
    assert groups["spark"][0][1]["_sudo"] is True


def test_overrides_and_ssh_keys_become_host_data(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = write(
        tmp_path,
        """
hosts:
  - {name: a, role: rtx4090, ssh_hostname: 10.1.1.1, ssh_port: 2222, data: {service_port: 9000}}
""",
    )
    monkeypatch.setenv("SERVEFLEET_FLEET", str(path))
    ((name, data),) = fleet_groups("inventory/rtx4090.py")["rtx4090"]
    assert name == "a" and data == {
        "ssh_hostname": "10.1.1.1",
        "ssh_port": 2222,
        "service_port": 9000,
    }


@pytest.mark.parametrize(
    "body,problem",
    [
        ("hosts:\n  - {name: a, role: gpu}", "hosts[0] (a): 'role' = 'gpu'"),
        (
            "hosts:\n  - {name: a, role: spark}\n  - {name: a, role: spark}",
            "hosts[1] (a): duplicate",
        ),
        ("hosts:\n  - {name: a, role: spark, ssh_port: '22'}", "'ssh_port' = '22': expected int"),
        ("hosts:\n  - {name: a, role: spark, ssh_hostnme: x}", "unknown keys ['ssh_hostnme']"),
        ("hosts:\n  - {role: spark}", "hosts[0]: 'name' = None"),
        ("hosts: [1]", "hosts[0]: expected a mapping"),
        ("hosts:\n  - {name: a, role: spark, data: {ssh_user: x}}", "put connection keys"),
        ("hosts: [", "not valid YAML"),
        ("hosts:\n  - {name: a, role: spark, role: depot}", "duplicate key 'role'"),
        ("", "empty"),
    ],
)
def test_malformed_fleet_names_file_entry_and_problem(tmp_path, body, problem):
    path = write(tmp_path, body)
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    assert str(path) in str(err.value) and problem in str(err.value)


def test_non_utf8_fleet_is_one_line(tmp_path):
    path = tmp_path / "fleet.yml"
    path.write_bytes(b"hosts:\n  - {name: caf\xe9, role: spark}\n")
    with pytest.raises(FleetError, match="not UTF-8"):
        load_fleet(path)


def pyinfra_cli(tmp_path, fleet: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYINFRA, "-y", *args, "inventory/spark.py", "deploys/base.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "SERVEFLEET_FLEET": str(write(tmp_path, fleet)),
            "HOME": str(tmp_path),
        },
    )


FLEET = "hosts:\n  - {name: spark-01, role: spark, ssh_hostname: 192.0.2.10%s}\n"


@pytest.mark.parametrize(
    "fleet,args,line",
    [
        (
            FLEET % ", data: {serivce_port: 8001}",
            (),
            "unknown key 'serivce_port' in {fleet}: hosts[0] (spark-01) (did you mean service_port?)",
        ),
        (
            FLEET % "",
            ("--data", "servce_host=0.0.0.0"),
            "unknown key 'servce_host' in --data (did you mean service_host?)",
        ),
        (FLEET % ", data: {service_port: '80a'}", (), "key 'service_port' = '80a' (str) from"),
        (
            FLEET % "",
            ("--data", "service_host=fe80::1%eth0"),
            "key 'service_host' = 'fe80::1%eth0' (str) from --data; expected an IP address without a "
            "scope id",
        ),
        (FLEET % ", data: {servefleet_root: /}", (), "key 'servefleet_root' = '/'"),
        (FLEET % ", data: {servefleet_user: Root}", (), "key 'servefleet_user' = 'Root'"),
    ],
)
def test_bad_data_stops_the_pyinfra_cli_before_connecting(tmp_path, fleet, args, line):
    """Unknown and mistyped keys in fleet.yml `data:` and --data: one line, exit 2, nothing
    connected (the address is a documentation address that would time out)."""
    done = pyinfra_cli(tmp_path, fleet, *args)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    line = line.replace("{fleet}", str(tmp_path / "fleet.yml"))
    assert line in out and "invalid data for host spark-01" in out
    assert "Traceback" not in out and "Connecting" not in out


def debug_inventory(tmp_path, fleet: str, *args: str) -> subprocess.CompletedProcess:
    """`pyinfra inventory/spark.py debug-inventory`: loads (and checks) the inventory, connects
    nowhere. HOME is tmp_path: ~/.ssh/config is the test's own."""
    return subprocess.run(
        [PYINFRA, *args, "inventory/spark.py", "debug-inventory"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "SERVEFLEET_FLEET": str(write(tmp_path, fleet)),
            "HOME": str(tmp_path),
        },
    )


WARNING = "WARNING: SSH host-key checking is OFF for spark-01"


@pytest.mark.parametrize(
    "args,config,how",
    [
        (
            ("--data", "ssh_strict_host_key_checking=no"),
            "",
            "ssh_strict_host_key_checking: no, --data",
        ),
        (
            ("--data", "ssh_known_hosts_file=/dev/null"),
            "",
            "ssh_known_hosts_file: /dev/null (keeps",
        ),
        ((), "Host 192.0.2.*\n  UserKnownHostsFile=/dev/null\n", "UserKnownHostsFile /dev/null"),
        (
            ("--data", f"ssh_config_file={REPO}/tests/fixtures/ssh_config_devnull"),
            "",
            "UserKnownHostsFile /dev/null ~/.ssh/known_hosts (keeps no key), " + str(REPO),
        ),
    ],
    ids=["data-strict-no", "data-dev-null", "config-by-address", "config-file-in-data"],
)
def test_host_key_checking_off_is_warned_wherever_it_is_set(tmp_path, args, config, how):
    """--data and the OpenSSH client config pyinfra reads (~/.ssh/config), not only fleet.yml."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(config)
    done = debug_inventory(tmp_path, FLEET % "", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count(WARNING) == 1 and how in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    "config",
    [
        "Host other-*\n  UserKnownHostsFile /dev/null\n",  # another host's
        "Host *\n  StrictHostKeyChecking no\n",  # pyinfra passes accept-new ahead of it
        "Host spark-01\n  UserKnownHostsFile /dev/null\n",  # pyinfra looks up ssh_hostname
        "Host *\n  UserKnownHostsFile ~/.ssh/known_hosts\n",
    ],
)
def test_an_ssh_config_that_keeps_checking_on_is_not_warned(tmp_path, config):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(config)
    done = debug_inventory(tmp_path, FLEET % "")
    assert done.returncode == 0 and WARNING not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    "entry,line",
    [
        (", ssh_key: /nonexistent/id_ed25519", "key 'ssh_key' from"),
        (", ssh_key: ~nosuchuser/key", "~user names no user"),
        (", ssh_port: 22:00", "'22:00' is read by YAML 1.1 as the integer 1320"),
        (", data: {service_port: 010}", "'010' is read by YAML 1.1 as the integer 8"),
        (', ssh_hostname: "10.0.0.1\\x7f"', "expected a value without spaces or control"),
        (", ssh_user: -oProxyCommand=x", "'ssh_user' = '-oProxyCommand=x': expected a user name"),
    ],
)
def test_fleet_mistakes_stop_the_pyinfra_cli_in_one_line(tmp_path, entry, line):
    """Refused before connecting: one line, exit 2, no traceback (issue #30 item 3)."""
    done = pyinfra_cli(tmp_path, "hosts:\n  - {name: spark-01, role: spark" + entry + "}\n")
    out = done.stdout + done.stderr
    assert done.returncode == 2 and line in out, out[-2000:]
    assert "Traceback" not in out and "Connecting" not in out and "could not connect" not in out


def test_a_key_written_u2028_after_a_comment_is_refused_with_its_line(tmp_path):
    path = write(tmp_path, "hosts:\n  - name: a  # note\u2028    ssh_port: 2\n    role: spark\n")
    with pytest.raises(FleetError, match="refused at line 2: U\\+2028"):
        load_fleet(path)


@pytest.mark.parametrize("second", ["Spark-01", "spark-01.", "SPARK-01."])
def test_names_that_differ_only_in_case_or_a_trailing_dot_are_one_host(tmp_path, second):
    path = write(
        tmp_path,
        f"hosts:\n  - {{name: spark-01, role: spark}}\n  - {{name: {second}, role: spark}}\n",
    )
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    assert f"hosts[1] ({second}): duplicate name: the same host as hosts[0] (spark-01)" in str(
        err.value
    )


def test_pyinfra_never_applies_the_ssh_configs_strict_host_key_checking(tmp_path):
    """Why `StrictHostKeyChecking no` in ~/.ssh/config is not warned: pyinfra's connector reads
    it only when ssh_strict_host_key_checking is None, and pyinfra refuses None for that key
    (its default is accept-new). If a pyinfra release takes None, core/host_keys.py must warn."""
    done = debug_inventory(tmp_path, FLEET % "", "--data", "ssh_strict_host_key_checking=null")
    assert done.returncode != 0
    assert "Invalid connector data `ssh_strict_host_key_checking`" in done.stdout + done.stderr
