"""`servefleet testbed fleet` (#30, rehearsing the first-node path): the file it writes is one the
strict fleet.yml parser accepts, and each host's data through it (inventory/fleet.py,
inventory/<class>.py) is exactly its data through inventory/testbed.py: the same node, whichever
inventory converges it. `testbed: true` is what lets a fleet.yml host take testbed-only knobs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from servefleet.core.errors import DataError
from servefleet.fleet.inventory import fleet_groups, load_fleet
from servefleet_dev.testbed import fleetfile
from servefleet_dev.testbed.state import load_state

REPO = Path(__file__).resolve().parents[2]
SERVEFLEET = str(Path(sys.executable).with_name("servefleet"))
HUB = "http://10.207.254.1:8093"
HOSTS = {  # a testbed as `up --hosts spark-1,rtx4090-1,depot-1,spark-llamacpp-1` records it
    "spark-1": ("spark", 22),
    "rtx4090-1": ("rtx4090", 22),
    "depot-1": ("depot", 2222),
    "spark-llamacpp-1": ("spark-llamacpp", 22),
}


@pytest.fixture
def testbed_state(tmp_path, monkeypatch):
    """A testbed's state and files in a cache of the test's own (instance 130): no guest runs."""
    monkeypatch.setenv("SERVEFLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SERVEFLEET_TESTBED_INSTANCE", "130")
    monkeypatch.chdir(REPO)
    ssh = tmp_path / "cache" / "testbed" / "ssh"
    ssh.mkdir(parents=True, mode=0o700)
    key = ssh / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    own = tmp_path / "cache" / "testbed-130"
    own.mkdir()
    (own / "known_hosts").write_text("")
    hosts = {
        name: {"name": name, "role": role, "address": f"10.207.0.{10 + i}", "ssh_port": port}
        for i, (name, (role, port)) in enumerate(HOSTS.items())
    }
    state = {"hosts": hosts, "services": {"hub": {"url": HUB}}, "network_up": True}
    (own / "state.json").write_text(json.dumps(state))
    return load_state()


def host_data(inventory: str) -> dict:
    """Each host's whole data as pyinfra gives it to the deploy (group data merged)."""
    with ctx_state.use(State()):  # an inventory file is run in a pyinfra state, as by the CLI
        inv = make_inventory(inventory, cwd=str(REPO))
    return {h.name: (h.data.dict(), set(h.groups)) for h in inv}


def test_the_file_loads_and_names_what_a_real_node_needs(testbed_state, tmp_path):
    path = tmp_path / "fleet.yml"
    fleetfile.write(path, fleetfile.render(testbed_state, path))
    assert path.read_text().startswith(fleetfile.HEADER)
    hosts = {h.name: h for h in load_fleet(path)}  # the strict parser: every form accepted
    assert list(hosts) == list(HOSTS)
    spark, depot, mixed = hosts["spark-1"], hosts["depot-1"], hosts["spark-llamacpp-1"]
    assert (spark.role, spark.engine, spark.testbed) == ("spark", "vllm", True)
    assert (mixed.role, mixed.engine) == ("spark", "llamacpp")
    assert "engine:" not in path.read_text().split("spark-llamacpp-1")[0]  # a class's own: unsaid
    assert depot.connection["ssh_port"] == 2222 and depot.connection["_sudo"] is True
    assert spark.connection["ssh_user"] == "fleetadmin"
    assert spark.connection["ssh_strict_host_key_checking"] == "yes"
    assert Path(spark.connection["ssh_key"]).is_file()
    assert spark.connection["ssh_known_hosts_file"].endswith("/testbed-130/known_hosts")
    # The rest comes from group_data/testbed*.py; a native guest says its architecture.
    assert spark.data == {"hf_endpoint": HUB, "expected_arch": "x86_64"}  # amd64 guests
    assert f"export SERVEFLEET_FLEET={path}" in path.read_text()


@pytest.mark.parametrize("inventory", ["inventory/fleet.py", "inventory/spark.py"])
def test_each_host_has_the_same_data_as_through_the_testbed_inventory(
    testbed_state, tmp_path, monkeypatch, inventory
):
    path = tmp_path / "fleet.yml"
    fleetfile.write(path, fleetfile.render(testbed_state, path))
    testbed = host_data("inventory/testbed.py")
    monkeypatch.setenv("SERVEFLEET_FLEET", str(path))
    fleet = host_data(inventory)
    assert fleet, inventory
    for name, (data, groups) in fleet.items():
        want, want_groups = testbed[name]
        assert data == want, name
        file_groups = {"testbed", Path(inventory).stem}
        assert groups - file_groups == want_groups - file_groups, name
    spark = fleet["spark-1"][0]  # what the issue had to guess, or could not set at all
    assert spark["vllm_executable"] == "/var/cache/servefleet/standin/vllm-standin"
    assert spark["pip_find_links"] == ["/var/cache/servefleet/wheels"]
    assert spark["hf_endpoint"] == HUB and spark["require_gpu"] is False


def test_testbed_only_knobs_need_testbed_true(testbed_state, tmp_path, monkeypatch):
    path = tmp_path / "fleet.yml"
    text = fleetfile.render(testbed_state, path).replace("testbed: true", "testbed: false")
    path.write_text(text.replace("hf_endpoint:", "vllm_executable: /x\n    hf_endpoint:"))
    monkeypatch.setenv("SERVEFLEET_FLEET", str(path))
    with pytest.raises(DataError) as err:
        fleet_groups("inventory/fleet.py")
    assert "'vllm_executable' is testbed-only" in str(err.value)


def test_testbed_must_be_true_or_false(tmp_path):
    path = tmp_path / "fleet.yml"
    path.write_text("hosts:\n  - {name: a, role: spark, testbed: 'yes'}\n")
    with pytest.raises(DataError, match=r"hosts\[0\] \(a\): 'testbed' = 'yes': expected true or"):
        load_fleet(path)


def test_an_operators_own_fleet_file_is_never_replaced(testbed_state, tmp_path):
    own = tmp_path / "fleet.yml"
    own.write_text("hosts: []\n")
    with pytest.raises(ValueError, match="not written by `servefleet testbed fleet`"):
        fleetfile.write(own, fleetfile.render(testbed_state, own))
    assert own.read_text() == "hosts: []\n"
    ours = tmp_path / "ours.yml"
    fleetfile.write(ours, fleetfile.render(testbed_state, ours))
    fleetfile.write(ours, fleetfile.render(testbed_state, ours) + "# again\n")  # its own: replaced
    assert ours.read_text().endswith("# again\n")


def test_a_path_that_cannot_be_written_is_one_line(testbed_state, tmp_path):
    path = tmp_path / "no-such-dir" / "fleet.yml"
    with pytest.raises(ValueError, match=r"no-such-dir/fleet.yml: cannot be written \(No such"):
        fleetfile.write(path, fleetfile.render(testbed_state, path))
