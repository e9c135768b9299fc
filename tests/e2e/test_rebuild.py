"""`servefleet rebuild`: a rebuilt host and a freshly created one check out identically."""

import json
import subprocess
import sys

import pytest

from servefleet.converge import pyinfra
from servefleet.paths import REPO_ROOT
from servefleet.testbed import lifecycle

pytestmark = pytest.mark.e2e
DEPLOY = "deploys/base.py"


def cli(*args, input_text=None):
    return subprocess.run([sys.executable, "-m", "servefleet.cli", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, input=input_text)


def drift_items(host):
    out = cli("drift", "inventory/testbed.py", DEPLOY, "--limit", host, "--json")
    report = json.loads(out.stdout)
    return out.returncode, [(i["name"], i["state"], i["expected"], i["found"])
                            for i in report["hosts"][host]["items"]]


def test_rebuilt_host_matches_a_fresh_one(testbed, th):
    assert pyinfra("inventory/testbed.py", DEPLOY, limit="depot-1").returncode == 0
    # Something servefleet installed, and a model file that must survive the rebuild.
    host = th("depot-1")
    assert host.run("mkdir -p /opt/servefleet/models/m && echo w > /opt/servefleet/models/m/w"
                    " && touch /opt/servefleet/state/stale-record").rc == 0

    out = cli("rebuild", "inventory/testbed.py", DEPLOY, "--limit", "depot-1", "--yes", "--json")
    assert out.returncode == 0, out.stderr + out.stdout[-3000:]
    summary = json.loads(out.stdout)
    assert summary["hosts"] == ["depot-1"] and summary["ok"]
    assert summary["teardown"]["changed"] > 0 and summary["converge"]["changed"] > 0
    assert host.file("/opt/servefleet/models/m/w").exists  # models kept
    assert not host.file("/opt/servefleet/state/stale-record").exists  # state wiped

    lifecycle.add("depot-2", log=lambda m: None)
    try:
        assert pyinfra("inventory/testbed.py", DEPLOY, limit="depot-2").returncode == 0
        rc1, rebuilt = drift_items("depot-1")
        rc2, fresh = drift_items("depot-2")
    finally:
        lifecycle.rm("depot-2", log=lambda m: None)
    assert rc1 == rc2 == 0
    assert rebuilt == fresh and rebuilt


def test_rebuild_refuses_more_hosts_than_allowed_and_unreachable_ones(testbed, fleet_file):
    import os

    out = cli("rebuild", "inventory/testbed.py", DEPLOY, "--limit", "testbed", "--yes")
    assert out.returncode == 2 and "more than --max-hosts 1" in out.stderr

    import yaml

    from servefleet.testbed import net
    path = fleet_file({"depot-1": ("depot", {})})
    fleet = yaml.safe_load(open(path))
    fleet["hosts"][0]["ssh_hostname"] = net.host_address(241)  # nobody there
    open(path, "w").write(yaml.safe_dump(fleet))
    proc = subprocess.run([sys.executable, "-m", "servefleet.cli", "rebuild",
                           "inventory/depot.py", DEPLOY, "--limit", "depot-1", "--yes"],
                          cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "SERVEFLEET_FLEET": path})
    assert proc.returncode == 2 and "cannot reach depot-1" in proc.stderr


def test_rebuild_asks_first(testbed, th):
    out = cli("rebuild", "inventory/testbed.py", DEPLOY, "--limit", "depot-1", input_text="no\n")
    assert out.returncode == 1 and "cancelled; nothing was changed" in out.stderr
    assert th("depot-1").file("/opt/servefleet/tools/venv/bin/uv").exists
