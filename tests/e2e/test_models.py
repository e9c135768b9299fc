"""Models on real testbed hosts: pinned + verified downloads, reruns that do nothing, a killed
download, a corrupt shard, a truncated file, the disk preflight, the hub token, the depot fan-out.

The tiny checkpoint (servefleet.testing.tiny_models) is published to the testbed's hub; each test
uses its own model directory, so the tests do not depend on each other's order.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time

import pytest

from servefleet import hub
from servefleet.converge import Run, pyinfra
from servefleet.paths import REPO_ROOT
from servefleet.testbed import net
from servefleet.testbed.services import hub_root
from servefleet.testbed.state import load_state
from servefleet.testing.tiny_models import build_tiny_checkpoint

pytestmark = pytest.mark.e2e
REPO = "servefleet-e2e/tiny"
CORRUPT_REPO = "servefleet-e2e/tiny-corrupt"
INCLUDE = ["*.json", "*.safetensors"]
SHARD1 = "model.safetensors-00001-of-00002.safetensors"
SHARD2 = "model.safetensors-00002-of-00002.safetensors"
NODE = "spark-1"
MODELS = "/opt/servefleet/models"


@pytest.fixture(scope="module")
def tiny(testbed, tmp_path_factory):
    src = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")
    sha = hub.publish(hub_root(), REPO, src)
    sizes = {p.name: p.stat().st_size for p in src.iterdir()}
    return {"src": src, "sha": sha, "sizes": sizes, "total": sum(sizes.values())}


@pytest.fixture(scope="module")
def hub_url(testbed):
    url = load_state().services["hub"]["url"]
    hub.clear_faults(url)
    yield url
    hub.clear_faults(url)


def model_data(dest, revision, repo=REPO, **extra):
    return {"model_repo": repo, "model_revision": revision, "model_include": json.dumps(INCLUDE),
            "model_dir": dest, **extra}


def deploy_model(dest, revision, limit=NODE, repo=REPO, env=None, **extra) -> Run:
    return pyinfra("inventory/testbed.py", "deploys/model.py", limit=limit,
                   data=model_data(dest, revision, repo, **extra), env=env, timeout=600)


def record(th, name, dest):
    f = th(name).file(f"{dest}/.servefleet/verified.json")
    return json.loads(f.content_string) if f.exists else None


def file_bytes(stats, repo, path) -> int:
    return stats["files"].get(f"{repo}/{path}", {}).get("bytes", 0)


def fresh(th, name, *paths):
    th(name).run("rm -rf " + " ".join(paths))


def test_bad_model_data_stops_the_run_before_any_change(testbed, th):
    dest = f"{MODELS}/e2e-bad"
    run = pyinfra("inventory/testbed.py", "deploys/model.py", limit=NODE,
                  data={"model_repo": REPO, "model_include": "[]", "model_dir": dest})
    assert run.returncode != 0
    assert "invalid data for host" in run.output and "'model_include' = []" in run.output
    assert "Starting operation" not in run.output
    assert not th(NODE).file(dest).exists


def test_pinned_download_verifies_then_reruns_without_changes(testbed, th, tiny, hub_url):
    dest = f"{MODELS}/e2e-pinned"
    fresh(th, NODE, dest)
    hub.hub_stats(hub_url, reset=True)
    first = deploy_model(dest, tiny["sha"])
    assert first.returncode == 0, first.output[-3000:]
    assert first.changed > 0
    assert hub.hub_stats(hub_url)["total_bytes"] == tiny["total"]

    rec = record(th, NODE, dest)
    assert rec["repo_id"] == REPO and rec["sha"] == tiny["sha"] and rec["revision"] == tiny["sha"]
    assert rec["files"] == tiny["sizes"]
    for name, size in tiny["sizes"].items():
        f = th(NODE).file(f"{dest}/{name}")
        assert f.size == size and f.user == "servefleet" and f.mode == 0o644
        want = hashlib.sha256((tiny["src"] / name).read_bytes()).hexdigest()
        assert rec["sha256"][name] == want

    # Rerun: decided from the record, no hub traffic at all for a pinned sha.
    hub.hub_stats(hub_url, reset=True)
    second = deploy_model(dest, tiny["sha"])
    assert second.returncode == 0, second.output[-3000:]
    assert second.changed == 0 and second.no_change == second.operations > 0
    stats = hub.hub_stats(hub_url)
    assert stats["total_bytes"] == 0 and stats["requests"]["api"] == 0

    # A branch name resolves to the same commit: still nothing to do (one API call, no bytes).
    third = deploy_model(dest, "main")
    assert third.returncode == 0 and third.changed == 0, third.output[-3000:]
    assert hub.hub_stats(hub_url)["total_bytes"] == 0

    # A truncated file voids the record: the next run fetches that file only, and verifies.
    th(NODE).run(f"truncate -s 1000 {dest}/{SHARD2}")
    hub.hub_stats(hub_url, reset=True)
    fourth = deploy_model(dest, tiny["sha"])
    assert fourth.returncode == 0 and fourth.changed > 0, fourth.output[-3000:]
    stats = hub.hub_stats(hub_url)
    assert file_bytes(stats, REPO, SHARD2) == tiny["sizes"][SHARD2]
    assert file_bytes(stats, REPO, SHARD1) == 0
    assert record(th, NODE, dest)["sha"] == tiny["sha"]


CHANGED_DEPLOY = """
from pyinfra import host, local
from pyinfra.operations import server
from servefleet import models

local.include("deploys/base.py")
run = models.ensure_model(repo_id=host.data.model_repo, revision=host.data.model_revision,
                          include=host.data.model_include, dest=host.data.model_dir)
server.shell(name="Marker (model changed)", commands=[f"echo changed >> {run.path}.marker"],
             _if=run.changed)
"""


def test_model_run_changed_is_true_only_when_files_were_fetched(testbed, th, tiny, tmp_path):
    dest = f"{MODELS}/e2e-changed"
    fresh(th, NODE, dest, f"{dest}.marker")
    deploy = tmp_path / "changed_deploy.py"
    deploy.write_text(CHANGED_DEPLOY)
    for _ in range(2):
        run = pyinfra("inventory/testbed.py", str(deploy), limit=NODE,
                      data=model_data(dest, tiny["sha"]), timeout=600)
        assert run.returncode == 0, run.output[-3000:]
    assert th(NODE).file(f"{dest}.marker").content_string == "changed\n"
    assert run.changed == 0


def _pyinfra_popen(dest, revision, limit=NODE, **extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pyinfra", "-y", "--limit", limit]
    for key, value in model_data(dest, revision, **extra).items():
        cmd += ["--data", f"{key}={value}"]
    cmd += ["inventory/testbed.py", "deploys/model.py"]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "NO_COLOR": "1"})


def test_killed_download_keeps_completed_files_and_recovers(testbed, th, tiny, hub_url):
    dest = f"{MODELS}/e2e-killed"
    fresh(th, NODE, dest)
    hub.hub_stats(hub_url, reset=True)
    hub.set_fault(hub_url, f"{REPO}/{SHARD2}", bytes_per_second=150_000)  # ~26 s for shard 2
    proc = _pyinfra_popen(dest, tiny["sha"])
    try:
        deadline = time.monotonic() + 240
        while file_bytes(hub.hub_stats(hub_url), REPO, SHARD2) < 600_000:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the download never started"
            time.sleep(0.5)
        # Kill the client mid-file, as a crash or a reboot would.
        killed = th(NODE).run("pids=$(pgrep -f '[v]env/bin/hf download'); "
                              "[ -n \"$pids\" ] && kill -KILL $pids")
        assert killed.rc == 0, killed.stderr
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hub.clear_faults(hub_url)
    assert proc.returncode != 0
    assert "hf download failed" in out
    node = th(NODE)
    assert node.file(f"{dest}/{SHARD1}").size == tiny["sizes"][SHARD1]  # completed: kept
    assert not node.file(f"{dest}/{SHARD2}").exists
    assert node.run(f"ls {dest}/.cache/huggingface/download/ | grep -c incomplete").stdout.strip() != "0"
    assert record(th, NODE, dest) is None  # not ready

    hub.hub_stats(hub_url, reset=True)
    again = deploy_model(dest, tiny["sha"])
    assert again.returncode == 0, again.output[-3000:]
    stats = hub.hub_stats(hub_url)
    assert file_bytes(stats, REPO, SHARD1) == 0  # the completed shard was not fetched again
    assert 0 < file_bytes(stats, REPO, SHARD2) <= tiny["sizes"][SHARD2]
    rec = record(th, NODE, dest)
    assert rec["sha"] == tiny["sha"] and rec["files"] == tiny["sizes"]
    assert node.file(f"{dest}/{SHARD2}").size == tiny["sizes"][SHARD2]


def test_corrupt_shard_is_refused_named_and_fetched_again(testbed, th, tiny, hub_url):
    """A mirror serves a shard with the right size and the wrong bytes."""
    dest = f"{MODELS}/e2e-corrupt"
    fresh(th, NODE, dest)
    sha = hub.publish(hub_root(), CORRUPT_REPO, tiny["src"])
    lfs = hashlib.sha256((tiny["src"] / SHARD1).read_bytes()).hexdigest()
    blob = hub.repo_dir(hub_root(), CORRUPT_REPO) / "blobs" / lfs
    good = blob.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    blob.write_bytes(bytes(bad))
    try:
        run = deploy_model(dest, sha, repo=CORRUPT_REPO)
    finally:
        blob.write_bytes(good)
    assert run.returncode != 0
    assert f"{SHARD1}: sha256" in run.output and "the next run fetches again" in run.output
    assert not th(NODE).file(f"{dest}/{SHARD1}").exists
    assert th(NODE).file(f"{dest}/{SHARD2}").exists  # good files stay
    assert record(th, NODE, dest) is None

    hub.hub_stats(hub_url, reset=True)
    again = deploy_model(dest, sha, repo=CORRUPT_REPO)
    assert again.returncode == 0, again.output[-3000:]
    stats = hub.hub_stats(hub_url)
    assert file_bytes(stats, CORRUPT_REPO, SHARD1) == tiny["sizes"][SHARD1]
    assert file_bytes(stats, CORRUPT_REPO, SHARD2) == 0
    assert record(th, NODE, dest)["sha256"][SHARD1] == lfs


def test_disk_preflight_fails_the_host_before_fetching_a_byte(testbed, th, tiny, hub_url):
    dest = f"{MODELS}/e2e-disk"
    fresh(th, NODE, dest)
    hub.hub_stats(hub_url, reset=True)
    run = deploy_model(dest, tiny["sha"], download_margin_bytes=10**15)
    assert run.returncode != 0
    assert "not enough free disk" in run.output and "nothing was fetched" in run.output
    assert hub.hub_stats(hub_url)["total_bytes"] == 0
    assert th(NODE).run(f"ls {dest}").stdout.strip() == ""


def test_token_is_used_written_0600_and_never_printed(testbed, th, tiny):
    token = "hf_e2eSecretToken" + hashlib.sha256(os.urandom(8)).hexdigest()[:16]
    dest = f"{MODELS}/e2e-token"
    fresh(th, NODE, dest)
    with hub.running_hub(hub_root(), host=net.HOST_ADDR, token=token) as url:
        denied = pyinfra("inventory/testbed.py", "deploys/model.py", limit=NODE,
                         data=model_data(dest, "main", hf_endpoint=url), env={"HF_TOKEN": ""},
                         timeout=600)
        assert denied.returncode != 0
        assert "no token was given" in denied.output

        for verbosity in (("-vvv",), ()):  # -vvv: every command and its output
            run = pyinfra("inventory/testbed.py", "deploys/model.py", *verbosity, limit=NODE,
                          data=model_data(dest, "main", hf_endpoint=url), env={"HF_TOKEN": token},
                          timeout=600)
            assert run.returncode == 0, run.output[-3000:]
            assert token not in run.output
    node = th(NODE)
    f = node.file("/opt/servefleet/etc/hf_token")
    assert f.mode == 0o600 and f.user == "servefleet" and f.group == "servefleet"
    assert f.content_string.strip() == token
    assert record(th, NODE, dest)["sha"] == tiny["sha"]
    # Nowhere else on the node: not in the fetch request, not in hf's own files.
    leaks = node.run(f"grep -rl {token} /opt/servefleet --exclude=hf_token || true").stdout.strip()
    assert leaks == ""


def test_depot_fanout_fetches_upstream_once(testbed, th, tiny, hub_url):
    nodes = ["spark-1", "rtx4090-1"]
    dest = f"{MODELS}/e2e-depot"
    fresh(th, "depot-1", f"/opt/servefleet/depot/{REPO}")
    for name in nodes:
        fresh(th, name, dest)
    models = json.dumps([{"repo_id": REPO, "revision": "main", "include": INCLUDE}])
    hub.hub_stats(hub_url, reset=True)
    run_depot = pyinfra("inventory/testbed.py", "deploys/depot.py", limit="depot-1",
                        data={"depot_models": models}, timeout=600)
    assert run_depot.returncode == 0, run_depot.output[-3000:]
    depot_rec = record(th, "depot-1", f"/opt/servefleet/depot/{REPO}/{tiny['sha']}")
    assert depot_rec["files"] == tiny["sizes"]
    assert th("depot-1").file(f"/opt/servefleet/depot/{REPO}/refs/main").content_string.strip() \
        == tiny["sha"]

    node_data = {"model_source": "depot", "depot_host": "depot-1"}
    run_nodes = deploy_model(dest, "main", limit=",".join(nodes), **node_data)
    assert run_nodes.returncode == 0, run_nodes.output[-3000:]
    assert hub.hub_stats(hub_url)["total_bytes"] == tiny["total"]  # one copy for the fleet
    for name in nodes:
        rec = record(th, name, dest)
        assert rec["source"] == "depot" and rec["sha"] == tiny["sha"]
        assert rec["sha256"] == depot_rec["sha256"]
        key = th(name).file("/opt/servefleet/etc/depot_key")
        assert key.mode == 0o600 and key.user == "servefleet"

    # Reruns change nothing anywhere.
    again_depot = pyinfra("inventory/testbed.py", "deploys/depot.py", limit="depot-1",
                          data={"depot_models": models}, timeout=600)
    assert again_depot.returncode == 0 and again_depot.changed == 0, again_depot.output[-3000:]
    again_nodes = deploy_model(dest, "main", limit=",".join(nodes), **node_data)
    assert again_nodes.returncode == 0 and again_nodes.changed == 0, again_nodes.output[-3000:]

    # The fleet key reads the store and does nothing else.
    depot_addr = load_state().hosts["depot-1"].address
    ssh = ("ssh -i /opt/servefleet/etc/depot_key -o UserKnownHostsFile=/opt/servefleet/etc/"
           "depot_known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes")
    as_user = "runuser -u servefleet -- "
    node = th(nodes[0])
    listing = node.run(f"{as_user} rsync -e '{ssh}' sfdepot@{depot_addr}:{REPO}/")
    assert listing.rc == 0 and tiny["sha"] in listing.stdout
    write = node.run(f"{as_user} rsync -e '{ssh}' /etc/hostname sfdepot@{depot_addr}:{REPO}/x")
    assert write.rc != 0
    shell = node.run(f"{as_user} {ssh} sfdepot@{depot_addr} id")
    assert shell.rc != 0 and "uid=" not in shell.stdout


def test_interrupted_depot_copy_resumes(testbed, th, tiny, hub_url):
    node, dest = "rtx4090-1", f"{MODELS}/e2e-depot-resume"
    fresh(th, node, dest)
    models = json.dumps([{"repo_id": REPO, "revision": "main", "include": INCLUDE}])
    run_depot = pyinfra("inventory/testbed.py", "deploys/depot.py", limit="depot-1",
                        data={"depot_models": models}, timeout=600)
    assert run_depot.returncode == 0, run_depot.output[-3000:]

    # ~250 KiB/s: each shard takes ~16 s; cut the SSH transport mid-file, like a network drop.
    proc = _pyinfra_popen(dest, tiny["sha"], limit=node, model_source="depot",
                          depot_host="depot-1", depot_bwlimit_kib=250)
    biggest = (f"find {dest} -name '.model*' -type f -printf '%s\\n' 2>/dev/null "
               "| sort -n | tail -1")
    try:
        deadline = time.monotonic() + 240
        while int(th(node).run(biggest).stdout.strip() or 0) < 1_000_000:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the copy never started"
            time.sleep(0.5)
        cut = th(node).run("pids=$(pgrep -f '[s]sh -i /opt/servefleet/etc/depot_key'); "
                           "[ -n \"$pids\" ] && kill -TERM $pids")
        assert cut.rc == 0, cut.stderr
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "rsync from depot" in out
    kept = th(node).run(f"find {dest}/.rsync-partial -type f -size +0 -printf '%s\\n'")
    assert kept.rc == 0 and int(kept.stdout.split()[0]) >= 1_000_000  # the partial file is kept
    assert record(th, node, dest) is None

    again = pyinfra("inventory/testbed.py", "deploys/model.py", "-vvv", limit=node, timeout=600,
                    data=model_data(dest, tiny["sha"], model_source="depot", depot_host="depot-1"))
    assert again.returncode == 0, again.output[-3000:]
    reused = re.search(r"(\d+) bytes reused from files already here", again.output)
    assert reused and int(reused.group(1)) >= 1_000_000, again.output[-3000:]  # resumed
    rec = record(th, node, dest)
    assert rec["source"] == "depot" and rec["files"] == tiny["sizes"]
    assert not th(node).file(f"{dest}/.rsync-partial").exists  # rsync's resumed file is used up
