"""Models on real testbed hosts: pinned + verified downloads, reruns that do nothing, a killed
download, a corrupt shard, a truncated file, the disk preflight, the hub token, the depot fan-out.

The tiny checkpoint (servefleet_dev.testing.tiny_models) is published to the testbed's hub; each test
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

from servefleet.core.layout import NodeLayout
from servefleet_dev import hub
from servefleet_dev.testbed import net
from servefleet_dev.testbed.services import hub_root
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, Run, pyinfra
from servefleet_dev.testing.tiny_models import build_tiny_checkpoint

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


def dest_of(repo: str, sha: str) -> str:
    """Where a node keeps repo at a commit: one directory per repo and commit (the layout)."""
    return f"{MODELS}/{repo.replace('/', '--')}/{sha}"


def own_repo(tiny, name: str) -> tuple[str, str]:
    """The tiny checkpoint under a repo id of the test's own: (repo, its directory on a node)."""
    repo = f"servefleet-e2e/{name}"
    assert hub.publish(hub_root(), repo, tiny["src"]) == tiny["sha"]
    return repo, dest_of(repo, tiny["sha"])


@pytest.fixture(scope="module")
def hub_url(testbed):
    url = load_state().services["hub"]["url"]
    hub.clear_faults(url)
    yield url
    hub.clear_faults(url)


def model_data(repo, revision, **extra):
    return {
        "model_repo": repo,
        "model_revision": revision,
        "model_include": json.dumps(INCLUDE),
        **extra,
    }


def deploy_model(repo, revision, limit=NODE, env=None, **extra) -> Run:
    return pyinfra(
        "inventory/testbed.py",
        "deploys/model.py",
        limit=limit,
        data=model_data(repo, revision, **extra),
        env=env,
        timeout=600,
    )


def record(th, name, dest):
    """Root's record that dest is complete and verified (state/verified: out of the engine's
    reach); the fetcher's copy inside dest (the manifest a depot serves) says the same."""
    f = th(name).file(NodeLayout.of({"servefleet_root": "/opt/servefleet"}).model_record(dest))
    if not f.exists:
        return None
    doc = json.loads(f.content_string)
    assert f.user == "root" and f.mode == 0o644
    assert json.loads(th(name).file(f"{dest}/.servefleet/verified.json").content_string) == doc
    return doc


def file_bytes(stats, repo, path) -> int:
    return stats["files"].get(f"{repo}/{path}", {}).get("bytes", 0)


def fresh(th, name, *paths):
    th(name).run("rm -rf " + " ".join(paths))


def test_bad_model_data_stops_the_run_before_any_change(testbed, th):
    for data, named in (
        ({"model_repo": REPO, "model_include": "[]"}, "'model_include' = []"),
        ({"model_repo": "org/.."}, "'model_repo' = 'org/..'"),
        ({"model_repo": REPO, "models_root": "/etc"}, "'models_root' = '/etc'"),
        ({}, "'model_repo' is missing; deploys/model.py needs"),
    ):
        run = pyinfra("inventory/testbed.py", "deploys/model.py", limit=NODE, data=data)
        assert run.returncode == 2, run.output[-2000:]
        assert "invalid data for host" in run.output and named in run.output
        assert "Connecting" not in run.output
    assert not th(NODE).file(f"{MODELS}/servefleet-e2e--tiny").exists


def test_pinned_download_verifies_then_reruns_without_changes(testbed, th, tiny, hub_url):
    repo, dest = own_repo(tiny, "pinned")
    fresh(th, NODE, dest)
    hub.hub_stats(hub_url, reset=True)
    first = deploy_model(repo, tiny["sha"])
    assert first.returncode == 0, first.output[-3000:]
    assert first.changed > 0
    assert hub.hub_stats(hub_url)["total_bytes"] == tiny["total"]

    rec = record(th, NODE, dest)
    assert rec["repo_id"] == repo and rec["sha"] == tiny["sha"] and rec["revision"] == tiny["sha"]
    assert rec["files"] == tiny["sizes"]
    for name, size in tiny["sizes"].items():
        f = th(NODE).file(f"{dest}/{name}")
        assert f.size == size and f.user == "servefleet" and f.mode == 0o644
        want = hashlib.sha256((tiny["src"] / name).read_bytes()).hexdigest()
        assert rec["sha256"][name] == want

    # Rerun: decided from the record, no hub traffic at all for a pinned sha.
    hub.hub_stats(hub_url, reset=True)
    second = deploy_model(repo, tiny["sha"])
    assert second.returncode == 0, second.output[-3000:]
    assert second.changed == 0 and second.no_change == second.operations > 0
    stats = hub.hub_stats(hub_url)
    assert stats["total_bytes"] == 0 and stats["requests"]["api"] == 0

    # A branch name resolves to the same commit, the same directory: nothing to do (an API
    # call, no bytes).
    third = deploy_model(repo, "main")
    assert third.returncode == 0 and third.changed == 0, third.output[-3000:]
    assert hub.hub_stats(hub_url)["total_bytes"] == 0

    # A truncated file voids the record: the next run fetches that file only, and verifies.
    th(NODE).run(f"truncate -s 1000 {dest}/{SHARD2}")
    hub.hub_stats(hub_url, reset=True)
    fourth = deploy_model(repo, tiny["sha"])
    assert fourth.returncode == 0 and fourth.changed > 0, fourth.output[-3000:]
    stats = hub.hub_stats(hub_url)
    assert file_bytes(stats, repo, SHARD2) == tiny["sizes"][SHARD2]
    assert file_bytes(stats, repo, SHARD1) == 0
    assert record(th, NODE, dest)["sha"] == tiny["sha"]


CHANGED_DEPLOY = """
from pyinfra import host
from pyinfra.operations import server
from servefleet.recipes import base, models

if base.begin("model"):
    base.node_base()
    run = models.ensure_model(repo_id=host.data.model_repo, revision=host.data.model_revision,
                              include=host.data.model_include)
    server.shell(name="Marker (model changed)", commands=[f"echo changed >> {run.path}.marker"],
                 _if=run.did_change)
"""


def test_model_run_changed_is_true_only_when_files_were_fetched(testbed, th, tiny, tmp_path):
    repo, dest = own_repo(tiny, "changed")
    fresh(th, NODE, dest, f"{dest}.marker")
    deploy = tmp_path / "changed_deploy.py"
    deploy.write_text(CHANGED_DEPLOY)
    for _ in range(2):
        run = pyinfra(
            "inventory/testbed.py",
            str(deploy),
            limit=NODE,
            data=model_data(repo, tiny["sha"]),
            timeout=600,
        )
        assert run.returncode == 0, run.output[-3000:]
    assert th(NODE).file(f"{dest}.marker").content_string == "changed\n"
    assert run.changed == 0


def _pyinfra_popen(repo, revision, limit=NODE, **extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pyinfra", "-y", "--limit", limit]
    for key, value in model_data(repo, revision, **extra).items():
        cmd += ["--data", f"{key}={value}"]
    cmd += ["inventory/testbed.py", "deploys/model.py"]
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_killed_download_keeps_completed_files_and_recovers(testbed, th, tiny, hub_url):
    repo, dest = own_repo(tiny, "killed")
    fresh(th, NODE, dest)
    hub.hub_stats(hub_url, reset=True)
    hub.set_fault(hub_url, f"{repo}/{SHARD2}", bytes_per_second=150_000)  # ~26 s for shard 2
    proc = _pyinfra_popen(repo, tiny["sha"])
    try:
        deadline = time.monotonic() + 240
        while file_bytes(hub.hub_stats(hub_url), repo, SHARD2) < 600_000:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the download never started"
            time.sleep(0.5)
        # Kill the client mid-file, as a crash or a reboot would.
        killed = th(NODE).run(
            "pids=$(pgrep -f '[v]env/bin/hf download'); [ -n \"$pids\" ] && kill -KILL $pids"
        )
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
    assert (
        node.run(f"ls {dest}/.cache/huggingface/download/ | grep -c incomplete").stdout.strip()
        != "0"
    )
    assert record(th, NODE, dest) is None  # not ready

    hub.hub_stats(hub_url, reset=True)
    again = deploy_model(repo, tiny["sha"])
    assert again.returncode == 0, again.output[-3000:]
    stats = hub.hub_stats(hub_url)
    assert file_bytes(stats, repo, SHARD1) == 0  # the completed shard was not fetched again
    assert 0 < file_bytes(stats, repo, SHARD2) <= tiny["sizes"][SHARD2]
    rec = record(th, NODE, dest)
    assert rec["sha"] == tiny["sha"] and rec["files"] == tiny["sizes"]
    assert node.file(f"{dest}/{SHARD2}").size == tiny["sizes"][SHARD2]


def test_corrupt_shard_is_refused_named_and_fetched_again(testbed, th, tiny, hub_url):
    """A mirror serves a shard with the right size and the wrong bytes."""
    sha = hub.publish(hub_root(), CORRUPT_REPO, tiny["src"])
    dest = dest_of(CORRUPT_REPO, sha)
    fresh(th, NODE, dest)
    lfs = hashlib.sha256((tiny["src"] / SHARD1).read_bytes()).hexdigest()
    blob = hub.repo_dir(hub_root(), CORRUPT_REPO) / "blobs" / lfs
    good = blob.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    blob.write_bytes(bytes(bad))
    try:
        run = deploy_model(CORRUPT_REPO, sha)
    finally:
        blob.write_bytes(good)
    assert run.returncode != 0
    assert f"{SHARD1}: sha256" in run.output and "the next run fetches again" in run.output
    assert not th(NODE).file(f"{dest}/{SHARD1}").exists
    assert th(NODE).file(f"{dest}/{SHARD2}").exists  # good files stay
    assert record(th, NODE, dest) is None

    hub.hub_stats(hub_url, reset=True)
    again = deploy_model(CORRUPT_REPO, sha)
    assert again.returncode == 0, again.output[-3000:]
    stats = hub.hub_stats(hub_url)
    assert file_bytes(stats, CORRUPT_REPO, SHARD1) == tiny["sizes"][SHARD1]
    assert file_bytes(stats, CORRUPT_REPO, SHARD2) == 0
    assert record(th, NODE, dest)["sha256"][SHARD1] == lfs


def test_disk_preflight_fails_the_host_before_fetching_a_byte(testbed, th, tiny, hub_url):
    repo, dest = own_repo(tiny, "disk")
    fresh(th, NODE, dest)
    hub.hub_stats(hub_url, reset=True)
    run = deploy_model(repo, tiny["sha"], download_margin_bytes=10**15)
    assert run.returncode != 0
    assert "not enough free disk" in run.output and "nothing was fetched" in run.output
    assert hub.hub_stats(hub_url)["total_bytes"] == 0
    assert th(NODE).run(f"ls {dest} 2>/dev/null").stdout.strip() == ""


def test_token_is_used_written_0600_and_never_printed(testbed, th, tiny):
    token = "hf_e2eSecretToken" + hashlib.sha256(os.urandom(8)).hexdigest()[:16]
    repo, dest = own_repo(tiny, "token")
    fresh(th, NODE, dest)
    with hub.running_hub(hub_root(), host=net.HOST_ADDR, token=token) as url:
        denied = pyinfra(
            "inventory/testbed.py",
            "deploys/model.py",
            limit=NODE,
            data=model_data(repo, "main", hf_endpoint=url),
            env={"HF_TOKEN": ""},
            timeout=600,
        )
        assert denied.returncode != 0
        assert "no token was given" in denied.output

        for verbosity in (("-vvv",), ()):  # -vvv: every command and its output
            run = pyinfra(
                "inventory/testbed.py",
                "deploys/model.py",
                *verbosity,
                limit=NODE,
                data=model_data(repo, "main", hf_endpoint=url),
                env={"HF_TOKEN": token},
                timeout=600,
            )
            assert run.returncode == 0, run.output[-3000:]
            assert token not in run.output
    node = th(NODE)
    f = node.file("/opt/servefleet/etc/hf-token")
    assert f.mode == 0o400 and f.user == "servefleet" and f.group == "root"
    assert f.content_string.strip() == token
    assert record(th, NODE, dest)["sha"] == tiny["sha"]
    # Nowhere else on the node: not in the fetch request, not in hf's own files.
    leaks = node.run(f"grep -rl {token} /opt/servefleet --exclude=hf-token || true").stdout.strip()
    assert leaks == ""


def test_depot_fanout_fetches_upstream_once(testbed, th, tiny, hub_url):
    nodes = ["spark-1", "rtx4090-1"]
    dest = dest_of(REPO, tiny["sha"])
    fresh(th, "depot-1", f"/opt/servefleet/depot/{REPO.replace('/', '--')}")
    for name in nodes:
        fresh(th, name, dest)
    models = json.dumps([{"repo_id": REPO, "revision": "main", "include": INCLUDE}])
    hub.hub_stats(hub_url, reset=True)
    run_depot = pyinfra(
        "inventory/testbed.py",
        "deploys/depot.py",
        limit="depot-1",
        data={"depot_models": models},
        timeout=600,
    )
    assert run_depot.returncode == 0, run_depot.output[-3000:]
    store = f"/opt/servefleet/depot/{REPO.replace('/', '--')}"
    depot_rec = record(th, "depot-1", f"{store}/{tiny['sha']}")
    assert depot_rec["files"] == tiny["sizes"]
    ref = f"/opt/servefleet/state/depot-refs/{REPO.replace('/', '--')}/main"
    assert th("depot-1").file(ref).content_string.strip() == tiny["sha"]
    assert th("depot-1").file(ref).user == "root"  # root's record, not the store's

    node_data = {"model_source": "depot", "depot_host": "depot-1"}
    run_nodes = deploy_model(REPO, "main", limit=",".join(nodes), **node_data)
    assert run_nodes.returncode == 0, run_nodes.output[-3000:]
    assert hub.hub_stats(hub_url)["total_bytes"] == tiny["total"]  # one copy for the fleet
    for name in nodes:
        rec = record(th, name, dest)
        assert rec["source"] == "depot" and rec["sha"] == tiny["sha"]
        assert rec["sha256"] == depot_rec["sha256"]
        key = th(name).file("/opt/servefleet/etc/depot-key")
        assert key.mode == 0o400 and key.user == "servefleet"

    # Reruns change nothing anywhere.
    again_depot = pyinfra(
        "inventory/testbed.py",
        "deploys/depot.py",
        limit="depot-1",
        data={"depot_models": models},
        timeout=600,
    )
    assert again_depot.returncode == 0 and again_depot.changed == 0, again_depot.output[-3000:]
    again_nodes = deploy_model(REPO, "main", limit=",".join(nodes), **node_data)
    assert again_nodes.returncode == 0 and again_nodes.changed == 0, again_nodes.output[-3000:]

    # The fleet key reads the store and does nothing else.
    depot = load_state().hosts["depot-1"]
    ssh = (
        f"ssh -p {depot.ssh_port} -i /opt/servefleet/etc/depot-key -o UserKnownHostsFile="
        "/opt/servefleet/etc/depot-known-hosts -o StrictHostKeyChecking=yes -o BatchMode=yes"
    )
    as_user = "runuser -u servefleet -- "
    node = th(nodes[0])
    repo_dir = REPO.replace("/", "--")
    listing = node.run(f"{as_user} rsync -e '{ssh}' sfdepot@{depot.address}:{repo_dir}/")
    assert listing.rc == 0 and tiny["sha"] in listing.stdout
    write = node.run(
        f"{as_user} rsync -e '{ssh}' /etc/hostname sfdepot@{depot.address}:{repo_dir}/x"
    )
    assert write.rc != 0
    shell = node.run(f"{as_user} {ssh} sfdepot@{depot.address} id")
    assert shell.rc != 0 and "uid=" not in shell.stdout

    # Back to the hub: the node keeps no fleet key it no longer uses.
    back = deploy_model(REPO, "main", limit=nodes[0])
    assert back.returncode == 0, back.output[-3000:]
    for leftover in ("depot-key", "depot-known-hosts"):
        assert not node.file(f"/opt/servefleet/etc/{leftover}").exists, leftover


def test_interrupted_depot_copy_resumes(testbed, th, tiny, hub_url):
    node = "rtx4090-1"
    repo, dest = own_repo(tiny, "depot-resume")
    fresh(th, node, dest)
    models = json.dumps([{"repo_id": repo, "revision": "main", "include": INCLUDE}])
    run_depot = pyinfra(
        "inventory/testbed.py",
        "deploys/depot.py",
        limit="depot-1",
        data={"depot_models": models},
        timeout=600,
    )
    assert run_depot.returncode == 0, run_depot.output[-3000:]

    # ~250 KiB/s: each shard takes ~16 s; cut the SSH transport mid-file, like a network drop.
    proc = _pyinfra_popen(
        repo,
        tiny["sha"],
        limit=node,
        model_source="depot",
        depot_host="depot-1",
        depot_bwlimit_kib=250,
    )
    biggest = f"find {dest} -name '.model*' -type f -printf '%s\\n' 2>/dev/null | sort -n | tail -1"
    try:
        deadline = time.monotonic() + 240
        while int(th(node).run(biggest).stdout.strip() or 0) < 1_000_000:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the copy never started"
            time.sleep(0.5)
        cut = th(node).run(
            "pids=$(pgrep -f '[s]sh -i /opt/servefleet/etc/depot-key'); "
            '[ -n "$pids" ] && kill -TERM $pids'
        )
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

    again = pyinfra(
        "inventory/testbed.py",
        "deploys/model.py",
        "-vvv",
        limit=node,
        timeout=600,
        data=model_data(repo, tiny["sha"], model_source="depot", depot_host="depot-1"),
    )
    assert again.returncode == 0, again.output[-3000:]
    reused = re.search(r"(\d+) bytes reused from files already here", again.output)
    assert reused and int(reused.group(1)) >= 1_000_000, again.output[-3000:]  # resumed
    rec = record(th, node, dest)
    assert rec["source"] == "depot" and rec["files"] == tiny["sizes"]
    assert not th(node).file(f"{dest}/.rsync-partial").exists  # rsync's resumed file is used up
