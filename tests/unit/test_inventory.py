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
    (spark,) = fleet_groups("inventory/spark.py", ["spark"])
    assert spark[0][1]["_sudo"] is True


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
    ((name, data),) = fleet_groups("inventory/rtx4090.py", ["rtx4090"])[0]
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
        (FLEET % ", data: {servefleet_user: root}", (), "key 'servefleet_user' = 'root'"),
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
