"""deploys/base.py on real testbed hosts, reached as a fleet is (a sudo user, pinned host keys):
converge, converge again with zero changes, verify; refusals change nothing."""

import json
import re
import subprocess
import sys

import pytest

from servefleet_dev.testbed import guest
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra, reads_of_a_noop

pytestmark = pytest.mark.e2e
HOSTS = "spark-1,rtx4090-1"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]


def test_invalid_data_stops_the_run_before_connecting(testbed, th):
    run = pyinfra(
        "inventory/testbed.py", "deploys/base.py", limit=HOSTS, data={"service_port": "abc"}
    )
    assert run.returncode == 2, run.output[-2000:]
    assert "invalid data for host" in run.output and "'service_port' = 'abc'" in run.output
    assert "Traceback" not in run.output and "Connecting" not in run.output
    for name in HOSTS.split(","):
        assert not th(name).file("/opt/servefleet").exists


def test_unknown_key_names_the_closest_one(testbed):
    run = pyinfra(
        "inventory/testbed.py", "deploys/base.py", limit=HOSTS, data={"serivce_port": "8001"}
    )
    assert run.returncode == 2
    assert "unknown key 'serivce_port' in --data (did you mean service_port?)" in run.output


def test_invalid_fleet_file_names_the_entry_and_connects_nowhere(testbed, tmp_path):
    bad = tmp_path / "fleet.yml"
    bad.write_text("hosts:\n  - {name: spark-9, role: sparc, ssh_hostname: 10.77.0.10}\n")
    run = pyinfra("inventory/spark.py", "deploys/base.py", env={"SERVEFLEET_FLEET": str(bad)})
    assert run.returncode == 2
    assert f"{bad}: hosts[0] (spark-9): 'role' = 'sparc'" in run.output
    assert "Connecting" not in run.output and "Traceback" not in run.output


def test_base_converges_as_the_sudo_user_then_is_idempotent(testbed, th):
    first = pyinfra("inventory/testbed.py", "deploys/base.py", limit=HOSTS)
    assert first.returncode == 0, first.output[-3000:]
    assert first.changed > 0 and first.errors == 0
    # pyinfra's v4 deprecation (a fact skipped because its command is missing) never shows.
    assert "will raise an exception in v4" not in first.output
    second = pyinfra("inventory/testbed.py", "deploys/base.py", limit=HOSTS)
    assert second.returncode == 0, second.output[-3000:]
    assert second.changed == 0 and second.no_change == second.operations > 0
    assert "will raise an exception in v4" not in second.output

    for name in HOSTS.split(","):
        host = th(name)
        user = host.user("servefleet")
        assert user.exists and user.shell == "/usr/sbin/nologin"
        assert user.home == "/opt/servefleet/cache"
        # Root owns the tree and everything root runs; the service owns its cache and models.
        for sub in ("", "/bin", "/tools", "/venvs", "/etc", "/state"):
            d = host.file(f"/opt/servefleet{sub}")
            assert d.is_directory and d.user == "root" and d.mode == 0o755, sub
        for sub, mode in (("/cache", 0o750), ("/models", 0o755)):
            d = host.file(f"/opt/servefleet{sub}")
            assert d.is_directory and d.user == "servefleet" and d.mode == mode, sub
        assert host.file("/opt/servefleet/tools/venv/bin/uv").user == "root"
        for pkg in ("git", "rsync", "python3-venv"):
            assert host.package(pkg).is_installed
        uv = host.run("/opt/servefleet/tools/venv/bin/uv --version")
        assert uv.rc == 0 and uv.stdout.startswith("uv 0.13.9")


def test_preflight_fails_only_the_host_concerned(testbed, fleet_file):
    # The same two testbed hosts as an operator's fleet; only rtx4090-1 is told to need a GPU.
    fleet = fleet_file(
        {
            "spark-1": ("rtx4090", {"require_gpu": False}),
            "rtx4090-1": ("rtx4090", {"require_gpu": True}),
        }
    )
    run = pyinfra("inventory/rtx4090.py", "deploys/base.py", env={"SERVEFLEET_FLEET": str(fleet)})
    assert run.returncode != 0
    assert "preflight failed on rtx4090-1: no NVIDIA GPU found" in run.output
    assert "preflight failed on spark-1" not in run.output
    assert not any(
        ln.strip().startswith("[spark-1]") and "Error" in ln for ln in run.output.splitlines()
    )


def test_a_recipe_on_a_host_of_another_role_is_a_visible_noop(testbed):
    run = pyinfra("inventory/testbed.py", "deploys/serve_bf16.py", limit="depot-1")
    assert run.returncode == 0, run.output[-2000:]
    assert run.changed == 0 and run.operations == 1
    assert "serve_bf16 acts on spark hosts only: nothing to do on depot-1" in run.output


def test_a_noop_check_of_the_base_is_one_command_per_node(testbed):
    assert pyinfra("inventory/testbed.py", "deploys/base.py", limit=HOSTS).returncode == 0
    for host in HOSTS.split(","):
        # Everything the base reads comes from one batched read (servefleet.facts.batch).
        assert reads_of_a_noop("inventory/testbed.py", "deploys/base.py", host) == {
            "dry": 1,
            "drift": 1,
        }


# A change made behind servefleet's back, the base step that must see it, and how to check the
# repair. Each is read from the one batched fact read (servefleet.facts.batch).
BEHIND_THE_BACK = {
    "package removed": (
        "dpkg --remove rsync",
        "Install OS packages (os_packages)",
        "dpkg-query -W -f='${db:Status-Abbrev}' rsync",
        "ii",
    ),
    "shell changed": (
        "usermod --shell /bin/bash servefleet",
        "System user servefleet",
        "getent passwd servefleet | cut -d: -f7",
        "/usr/sbin/nologin",
    ),
    "mode widened": (
        "chmod 777 /opt/servefleet/etc",
        "Directory /opt/servefleet/etc",
        "stat -c %a /opt/servefleet/etc",
        "755",
    ),
    "owner changed": (
        "chown servefleet /opt/servefleet/bin",
        "Directory /opt/servefleet/bin",
        "stat -c %U:%G /opt/servefleet/bin",
        "root:root",
    ),
    "venv broken": (
        "rm /opt/servefleet/tools/venv/pyvenv.cfg",
        "Tools venv /opt/servefleet/tools/venv",
        "test -f /opt/servefleet/tools/venv/pyvenv.cfg && echo present",
        "present",
    ),
    "tool removed": (
        "rm -r TOOLS_SITE/uv-0.13.9.dist-info",
        "Tools: uv 0.13.9",
        "ls -d TOOLS_SITE/uv-*.dist-info | wc -l",
        "1",
    ),
}


@pytest.mark.parametrize("case", list(BEHIND_THE_BACK))
def test_a_change_behind_the_back_is_seen_by_dry_and_drift_then_repaired(testbed, th, case):
    host, h = "spark-1", th("spark-1")
    # TOOLS_SITE: the tools venv's site-packages, under the guest's own Python (it is asked).
    tools_site = guest.site_packages(load_state().hosts[host], "/opt/servefleet/tools/venv")
    change, step, probe, expected = (
        part.replace("TOOLS_SITE", tools_site) for part in BEHIND_THE_BACK[case]
    )
    assert pyinfra("inventory/testbed.py", "deploys/base.py", limit=host).returncode == 0
    assert h.run(change).rc == 0
    dry = pyinfra("inventory/testbed.py", "deploys/base.py", "--dry", limit=host, yes=False)
    assert dry.returncode == 0 and re.search(re.escape(step) + r"\s+1\s", dry.output), dry.output[
        -3000:
    ]
    drift = subprocess.run(
        [*CLI, "drift", "inventory/testbed.py", "deploys/base.py", "--limit", host, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert drift.returncode == 1, drift.stdout[-3000:] + drift.stderr[-2000:]
    drifted = [
        i["name"]
        for i in json.loads(drift.stdout)["hosts"][host]["items"]
        if i["state"] == "drifted"
    ]
    assert [n for n in drifted if n.endswith(step)] and len(drifted) == 1, drifted
    fixed = pyinfra("inventory/testbed.py", "deploys/base.py", limit=host)
    assert fixed.returncode == 0 and fixed.changed >= 1, fixed.output[-3000:]
    assert h.check_output(probe).strip().startswith(expected)
    again = pyinfra("inventory/testbed.py", "deploys/base.py", limit=host)
    assert again.returncode == 0 and again.changed == 0, again.output[-3000:]
