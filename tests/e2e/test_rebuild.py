"""`servefleet rebuild` of every role: a rebuilt host and a freshly created one check out
identically (the same drift items); the depot keeps its store, nodes keep their models unless
--purge-models, and the release records go with the rest of the state."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from servefleet.core.layout import NodeLayout
from servefleet_dev.testbed import lifecycle, material, net
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra

pytestmark = pytest.mark.e2e
INVENTORY = "inventory/testbed.py"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
ROOT = "/opt/servefleet"
# role -> (deploy, host of the session, fresh host to compare with)
ROLES = {
    "depot": ("deploys/depot.py", "depot-1", "depot-2"),
    "spark": ("deploys/serve_bf16.py", "spark-1", "spark-2"),
    "rtx4090": ("deploys/serve_q4_llamacpp.py", "rtx4090-1", "rtx4090-2"),
}
DEPOT_MODELS = json.dumps(
    [
        {
            "repo_id": "Qwen/Qwen-AgentWorld-35B-A3B",
            "revision": "testbed-tiny",
            "include": ["*.json", "*.safetensors"],
        }
    ]
)


def cli(*args, input_text=None, env=None):
    return subprocess.run(
        [*CLI, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        input=input_text,
        env=env,
        timeout=3600,
    )


def data_for(role: str) -> list[str]:
    return ["--data", f"depot_models={DEPOT_MODELS}"] if role == "depot" else []


def drift_items(deploy: str, host: str, role: str):
    out = cli("drift", INVENTORY, deploy, "--limit", host, "--json", *data_for(role))
    report = json.loads(out.stdout)
    items = []
    for i in report["hosts"][host]["items"]:
        found = i["found"]
        if i["name"] in ("release", "running release"):  # ids and times are the host's own
            found = found.split(" (")[0]
        expected = i["expected"].split(" (")[0] if i["name"] == "running release" else i["expected"]
        # Items name the host they were rendered for ("... rendered for spark-1"): compare the rest.
        items.append(
            tuple(str(v).replace(host, "<host>") for v in (i["name"], i["state"], expected, found))
        )
    return out.returncode, items


@pytest.fixture(scope="module")
def material_ready(testbed):
    material.prepare()
    return testbed


@pytest.mark.parametrize("role", list(ROLES))
def test_rebuilt_host_matches_a_fresh_one(material_ready, th, role):
    deploy, host, fresh = ROLES[role]
    data = {"depot_models": DEPOT_MODELS} if role == "depot" else {}
    first = pyinfra(INVENTORY, deploy, limit=host, data=data, timeout=3600)
    assert first.returncode == 0, first.output[-3000:]
    h = th(host)
    keep = f"{ROOT}/depot" if role == "depot" else f"{ROOT}/models"
    kept = h.check_output(f"find {keep} -type f | sort")
    assert kept  # a store / model to keep
    assert h.run(f"touch {ROOT}/state/stale-record").rc == 0

    # The fresh host to compare with comes up and converges side by side with the rebuild
    # (independent hosts; mostly waiting on apt, pip and health checks).
    def fresh_host():
        lifecycle.add(fresh, log=lambda m: None)
        return pyinfra(INVENTORY, deploy, limit=fresh, data=data, timeout=3600)

    with ThreadPoolExecutor(max_workers=1) as pool:
        fresh_run = pool.submit(fresh_host)
        out = cli("rebuild", INVENTORY, deploy, "--limit", host, "--yes", "--json", *data_for(role))
        fresh_run.exception()  # wait for it
    try:
        run = fresh_run.result()
        assert out.returncode == 0, out.stderr + out.stdout[-3000:]
        summary = json.loads(out.stdout)  # {"hosts": {name: ...}, "summary", "exit_code"}
        assert list(summary["hosts"]) == [host] and summary["ok"]
        assert summary["summary"] == {"hosts": 1, "rebuilt": 1, "not_rebuilt": 0}
        assert summary["hosts"][host]["teardown"]["changed"] > 0
        assert summary["hosts"][host]["converge"]["changed"] > 0
        assert h.check_output(f"find {keep} -type f | sort") == kept  # store / models kept
        assert not h.file(f"{ROOT}/state/stale-record").exists  # state wiped
        if role != "depot":
            releases = json.loads(h.file(f"{ROOT}/state/releases.json").content_string)
            assert releases["previous"] == []  # a rebuilt node starts with no previous release
        assert run.returncode == 0, run.output[-3000:]
        rc1, rebuilt = drift_items(deploy, host, role)
        rc2, new = drift_items(deploy, fresh, role)
        s1 = cli("status", INVENTORY, "--limit", host, "--json")
        s2 = cli("status", INVENTORY, "--limit", fresh, "--json")
    finally:
        lifecycle.rm(fresh, log=lambda m: None)
    assert rc1 == rc2 == 0
    assert rebuilt == new and rebuilt
    (st1,), (st2,) = (
        json.loads(s1.stdout)["hosts"].values(),
        json.loads(s2.stdout)["hosts"].values(),
    )
    for key in ("host", "memory_used_gib", "memory_total_gib", "vram_used_gib"):
        st1.pop(key), st2.pop(key)
    assert st1 == st2


def test_purge_models_deletes_the_models_and_a_converge_fetches_them_again(material_ready, th):
    deploy, host, _ = ROLES["spark"]
    h = th(host)
    # What the purge must remove, whatever earlier tests left: another model's revision, and
    # the served one (a marker in its .cache/, which the fetcher leaves alone, tells a fresh
    # fetch from a kept directory).
    stale = f"{ROOT}/models/servefleet-e2e--stale/{'0' * 40}"
    h.run_test(f"install -d -o servefleet {stale} && echo x > {stale}/weights.safetensors")
    served = h.check_output(f"ls -d {ROOT}/models/*/*/ | grep -v stale").split()
    assert served, "no served model to purge"
    for d in served:
        h.run_test(f"install -d {d}.cache && touch {d}.cache/servefleet-purge-marker")
    out = cli("rebuild", INVENTORY, deploy, "--limit", host, "--yes", "--purge-models", "--json")
    assert out.returncode == 0, out.stderr + out.stdout[-3000:]
    # The old model revisions went; the converge fetched the one the data serves, verified.
    dirs = h.check_output(f"ls -d {ROOT}/models/*/*/").split()
    assert len(dirs) == 1
    assert not h.file(stale).exists
    assert not h.file(f"{dirs[0]}.cache/servefleet-purge-marker").exists, "kept, not purged"
    assert h.file(NodeLayout.of({"servefleet_root": ROOT}).model_record(dirs[0].rstrip("/"))).exists


def test_rebuild_refuses_more_hosts_than_allowed_and_unreachable_ones(testbed, fleet_file):
    out = cli("rebuild", INVENTORY, "deploys/base.py", "--limit", "testbed", "--yes")
    assert out.returncode == 2 and "more than --max-hosts 1" in out.stderr

    path = fleet_file({"depot-1": ("depot", {})})
    fleet = yaml.safe_load(open(path))
    fleet["hosts"][0]["ssh_hostname"] = net.host_address(241)  # nobody there
    open(path, "w").write(yaml.safe_dump(fleet))
    proc = cli(
        "rebuild",
        "inventory/depot.py",
        "deploys/base.py",
        "--limit",
        "depot-1",
        "--yes",
        env={**os.environ, "SERVEFLEET_FLEET": path},
    )
    assert proc.returncode == 3 and "cannot reach depot-1" in proc.stderr


def test_rebuild_asks_first(testbed, th):
    out = cli("rebuild", INVENTORY, "deploys/base.py", "--limit", "depot-1", input_text="no\n")
    assert out.returncode == 1 and "cancelled; nothing was changed" in out.stderr
    assert th("depot-1").file(f"{ROOT}/tools/venv/bin/uv").exists
