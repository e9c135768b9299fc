"""`servefleet drift` on the testbed: in sync → 0; drift → 1 and named; unreachable → 3."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from servefleet_dev.testbed import net
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra

pytestmark = pytest.mark.e2e


def drift(*args, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "drift", *args, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr


def drifted(report, host):
    return [i for i in report["hosts"][host]["items"] if i["state"] == "drifted"]


def test_drift_gates_on_real_changes_through_sudo(testbed, th):
    assert pyinfra("inventory/testbed.py", "deploys/base.py", limit="depot-1").returncode == 0
    rc, report = drift("inventory/testbed.py", "deploys/base.py", "--limit", "depot-1")
    assert rc == 0, report
    assert report["summary"] == {"hosts": 1, "in_sync": 1, "drifted": 0, "unchecked": 0}

    # A hand-made change on the host: the uv tool removed from the tools venv.
    assert th("depot-1").run("/opt/servefleet/tools/venv/bin/pip uninstall -y -q uv").rc == 0
    rc, report = drift("inventory/testbed.py", "deploys/base.py", "--limit", "depot-1")
    assert rc == 1
    (item,) = drifted(report, "depot-1")
    assert "uv 0.13.9" in item["name"] and "pip install" in item["found"]
    # Nothing was changed by the check.
    assert not th("depot-1").file("/opt/servefleet/tools/venv/bin/uv").exists

    assert pyinfra("inventory/testbed.py", "deploys/base.py", limit="depot-1").changed == 1
    rc, report = drift("inventory/testbed.py", "deploys/base.py", "--limit", "depot-1")
    assert rc == 0, report


def test_data_change_is_drift(testbed):
    rc, report = drift(
        "inventory/testbed.py",
        "deploys/base.py",
        "--limit",
        "depot-1",
        "--data",
        "servefleet_user=svc2",
    )
    assert rc == 1
    names = " ".join(i["name"] for i in drifted(report, "depot-1"))
    assert "System user svc2" in names


def test_unreachable_host_is_exit_3_and_wins(testbed, fleet_file):
    path = fleet_file({"depot-1": ("depot", {})})
    fleet = yaml.safe_load(open(path))
    # An address on the testbed's own bridge where no host lives.
    fleet["hosts"].append(
        {**fleet["hosts"][0], "name": "depot-gone", "ssh_hostname": net.host_address(240)}
    )
    open(path, "w").write(yaml.safe_dump(fleet))
    rc, report = drift(
        "inventory/depot.py", "deploys/base.py", env={**os.environ, "SERVEFLEET_FLEET": path}
    )
    assert rc == 3
    assert report["hosts"]["depot-gone"]["status"] == "unchecked"
    assert report["hosts"]["depot-gone"]["error"]  # pyinfra's reason, e.g. a timeout
    assert report["hosts"]["depot-1"]["status"] == "in_sync"
