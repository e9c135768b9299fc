"""deploys/base.py on real testbed hosts: converge, converge again with zero changes, verify."""

import pytest

from servefleet.converge import pyinfra

pytestmark = pytest.mark.e2e
HOSTS = "spark-1,rtx4090-1"


def test_invalid_data_stops_the_run_before_any_host_changes(testbed, th):
    run = pyinfra("inventory/testbed.py", "deploys/base.py", limit=HOSTS,
                  data={"service_port": "abc"})
    assert run.returncode != 0
    assert "invalid data for host" in run.output and "'service_port' = 'abc'" in run.output
    assert "Starting operation" not in run.output
    for name in HOSTS.split(","):
        assert not th(name).file("/opt/servefleet").exists


def test_invalid_fleet_file_names_the_entry_and_connects_nowhere(testbed, tmp_path):
    bad = tmp_path / "fleet.yml"
    bad.write_text("hosts:\n  - {name: spark-9, role: sparc, ssh_hostname: 10.77.0.10}\n")
    run = pyinfra("inventory/spark.py", "deploys/base.py", env={"SERVEFLEET_FLEET": str(bad)})
    assert run.returncode != 0
    assert f"{bad}: hosts[0] (spark-9): 'role' = 'sparc'" in run.output
    assert "Connected" not in run.output


def test_base_converges_then_is_idempotent(testbed, th):
    first = pyinfra("inventory/testbed.py", "deploys/base.py", limit=HOSTS)
    assert first.returncode == 0, first.output[-3000:]
    assert first.changed > 0 and first.errors == 0
    second = pyinfra("inventory/testbed.py", "deploys/base.py", limit=HOSTS)
    assert second.returncode == 0, second.output[-3000:]
    assert second.changed == 0 and second.no_change == second.operations > 0

    for name in HOSTS.split(","):
        host = th(name)
        user = host.user("servefleet")
        assert user.exists and user.shell == "/usr/sbin/nologin"
        for sub in ("", "/tools", "/venvs", "/models", "/state"):
            d = host.file(f"/opt/servefleet{sub}")
            assert d.is_directory and d.user == "servefleet"
        for pkg in ("git", "rsync", "python3-venv"):
            assert host.package(pkg).is_installed
        uv = host.run("/opt/servefleet/tools/venv/bin/uv --version")
        assert uv.rc == 0 and uv.stdout.startswith("uv 0.13.9")


def test_preflight_fails_only_the_host_concerned(testbed, fleet_file):
    # The same two testbed hosts as an operator's fleet; only rtx4090-1 is told to need a GPU.
    fleet = fleet_file({"spark-1": ("rtx4090", {"require_gpu": False}),
                        "rtx4090-1": ("rtx4090", {"require_gpu": True})})
    run = pyinfra("inventory/rtx4090.py", "deploys/base.py", env={"SERVEFLEET_FLEET": str(fleet)})
    assert run.returncode != 0
    assert "preflight failed on rtx4090-1: no NVIDIA GPU found" in run.output
    assert "preflight failed on spark-1" not in run.output
    # pyinfra counts every remaining op of the failed host as an error; spark-1 had none.
    assert run.errors == run.operations // 2
    assert not any(l.strip().startswith("[spark-1]") and "Error" in l for l in run.output.splitlines())


def test_a_recipe_on_a_host_of_another_role_is_a_visible_noop(testbed):
    run = pyinfra("inventory/testbed.py", "deploys/serve_bf16.py", limit="depot-1")
    assert run.returncode == 0, run.output[-2000:]
    assert run.changed == 0 and run.operations == 1
    assert "serve_bf16 acts on spark hosts only: nothing to do on depot-1" in run.output
