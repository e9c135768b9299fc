"""The local hub against the REAL huggingface_hub client (in-process and the `hf` CLI).

In-process calls pass endpoint= and cache_dir= explicitly: huggingface_hub reads HF_ENDPOINT and
HF_HOME once, at import. Subprocesses get HF_ENDPOINT/HF_HOME in their environment, as a user would.
"""

import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils.sha import git_hash

from servefleet import hub

REPO = "acme/tiny"
MODEL = "model.safetensors"
HF = Path(sys.executable).with_name("hf")
needs_hf_cli = pytest.mark.skipif(not HF.exists(), reason="hf CLI not installed next to python")


def _write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A store with two commits of acme/tiny: v1, then v2 (a new config) on main."""
    base = tmp_path_factory.mktemp("hub")
    weights = os.urandom(2_000_000)
    v1 = {
        "config.json": b'{"version": 1}\n',
        "tokenizer.json": b'{"vocab": {"a": 0}}\n',
        MODEL: weights,
        "docs/notes.txt": b"nested file\n",
    }
    v2 = dict(v1, **{"config.json": b'{"version": 2}\n'})
    root = base / "store"
    sha1 = hub.publish(root, REPO, _write_tree(base / "v1", v1), message="v1")
    sha2 = hub.publish(root, REPO, _write_tree(base / "v2", v2), message="v2")
    return {"root": root, "sha1": sha1, "sha2": sha2, "v1": v1, "v2": v2, "src_v2": base / "v2"}


@pytest.fixture
def url(published):
    with hub.running_hub(published["root"]) as url:
        yield url


@pytest.fixture
def hf_env(tmp_path, url, monkeypatch):
    """Environment for `hf` subprocesses: this hub, a private HF_HOME, no token, no phoning home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=url,
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_DISABLE_UPDATE_CHECK="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    for key in ("HF_ENDPOINT", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_TELEMETRY"):
        monkeypatch.setenv(key, env[key])
    return env


def hf(env, *args, check=True, timeout=120):
    proc = subprocess.run([str(HF), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"hf {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# -- publishing -------------------------------------------------------------------------------------


def test_publish_is_deterministic_and_classifies_lfs(published, tmp_path, url):
    # Same content -> same commit, no new ref movement.
    assert hub.publish(published["root"], REPO, published["src_v2"]) == published["sha2"]
    tree = {f.path: f for f in HfApi(endpoint=url).list_repo_tree(REPO, recursive=True, revision="main")}
    assert set(tree) == {"config.json", "tokenizer.json", MODEL, "docs", "docs/notes.txt"}
    weights = published["v2"][MODEL]
    assert tree[MODEL].lfs.sha256 == hashlib.sha256(weights).hexdigest()
    assert tree[MODEL].size == len(weights)
    assert tree["config.json"].lfs is None
    assert tree["config.json"].blob_id == git_hash(published["v2"]["config.json"])

    # Large files are LFS whatever their extension.
    big = _write_tree(tmp_path / "big", {"data.txt": b"x" * 2000})
    hub.publish(published["root"], "acme/big", big, lfs_threshold=1000)
    (entry,) = HfApi(endpoint=url).list_repo_tree("acme/big", revision="main")
    assert entry.lfs is not None and entry.lfs.sha256 == hashlib.sha256(b"x" * 2000).hexdigest()


def test_publish_cli_prints_the_same_sha(published, tmp_path):
    root = tmp_path / "store"
    out = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "hub", "publish", REPO, str(published["src_v2"]), "--root", str(root)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out == published["sha2"]
    assert (root / "models" / REPO / "refs" / "main").read_text().strip() == out


# -- downloads with the real client -------------------------------------------------------------------


def test_hf_hub_download_at_main_and_at_pinned_sha(published, url, tmp_path):
    cache = tmp_path / "cache"
    latest = hf_hub_download(REPO, "config.json", cache_dir=cache, endpoint=url)
    assert Path(latest).read_bytes() == published["v2"]["config.json"]
    pinned = hf_hub_download(REPO, "config.json", revision=published["sha1"], cache_dir=cache, endpoint=url)
    assert Path(pinned).read_bytes() == published["v1"]["config.json"]
    assert published["sha1"] in pinned
    weights = hf_hub_download(REPO, MODEL, cache_dir=cache, endpoint=url)
    assert sha256(weights) == hashlib.sha256(published["v2"][MODEL]).hexdigest()
    assert (cache / "models--acme--tiny" / "refs" / "main").read_text() == published["sha2"]


def test_snapshot_download_with_allow_patterns(published, url, tmp_path):
    path = snapshot_download(REPO, allow_patterns=["*.json"], cache_dir=tmp_path / "cache", endpoint=url)
    assert sorted(p.name for p in Path(path).rglob("*") if p.is_file()) == ["config.json", "tokenizer.json"]
    assert Path(path).name == published["sha2"]


@needs_hf_cli
def test_hf_download_cli_into_local_dir(published, hf_env, tmp_path):
    dest = tmp_path / "model"
    hf(hf_env, "download", REPO, "--local-dir", str(dest))
    for rel, data in published["v2"].items():
        assert (dest / rel).read_bytes() == data, rel
    assert "All checksums match" in hf(hf_env, "cache", "verify", REPO, "--local-dir", str(dest)).stdout


@needs_hf_cli
def test_hf_cache_verify_catches_a_corrupted_lfs_file(hf_env):
    hf(hf_env, "download", REPO)
    assert hf(hf_env, "cache", "verify", REPO).returncode == 0

    snapshot = Path(hf_env["HF_HOME"]) / "hub" / "models--acme--tiny" / "snapshots"
    (weights,) = snapshot.glob(f"*/{MODEL}")
    with open(weights, "r+b") as f:  # follows the snapshot symlink to the blob
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))

    proc = hf(hf_env, "cache", "verify", REPO, check=False)
    assert proc.returncode == 1
    assert MODEL in proc.stdout + proc.stderr


def test_missing_file_revision_and_repo_raise_the_hub_errors(published, url, tmp_path):
    kw = {"cache_dir": tmp_path / "cache", "endpoint": url}
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.json", **kw)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch", **kw)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="0" * 40, **kw)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/absent", "config.json", **kw)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="no-such-branch", **kw)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("acme/absent", **kw)


def test_range_request_answers_206_with_content_range(published, url):
    weights = published["v2"][MODEL]
    req = urllib.request.Request(f"{url}/{REPO}/resolve/main/{MODEL}", headers={"Range": "bytes=1000-"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 1000-{len(weights) - 1}/{len(weights)}"
        assert resp.headers["X-Repo-Commit"] == published["sha2"]
        assert resp.read() == weights[1000:]
    req = urllib.request.Request(f"{url}/{REPO}/resolve/main/{MODEL}", headers={"Range": f"bytes={len(weights)}-"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    assert err.value.code == 416


def test_client_resumes_a_broken_transfer_with_a_range_request(tmp_path):
    # The client writes in DOWNLOAD_CHUNK_SIZE (10 MiB) pieces and resumes from what it wrote, so the
    # cut must come after the first piece for a resume (rather than a restart) to happen.
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    weights = os.urandom(2 * chunk + 12345)
    cut = chunk + chunk // 2
    hub.publish(tmp_path / "store", "acme/big", _write_tree(tmp_path / "src", {MODEL: weights}))
    with hub.running_hub(tmp_path / "store") as url:
        hub.set_fault(url, f"acme/big/{MODEL}", drop_after=cut, times=1)
        path = hf_hub_download("acme/big", MODEL, cache_dir=tmp_path / "cache", endpoint=url)
        served = hub.hub_stats(url)["files"][f"acme/big/{MODEL}"]
    assert sha256(path) == hashlib.sha256(weights).hexdigest()
    # Two GETs, the second one ranged from the first whole piece: only the cut piece's tail is resent.
    resumed_at = cut // chunk * chunk
    assert served == {"bytes": cut + len(weights) - resumed_at, "gets": 2, "range_gets": 1}


def test_token_is_required_when_configured(published, tmp_path):
    with hub.running_hub(published["root"], token="s3cret") as url:
        kw = {"cache_dir": tmp_path / "cache", "endpoint": url}
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download(REPO, "config.json", token=False, **kw)
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download(REPO, "config.json", token="wrong", **kw)
        path = hf_hub_download(REPO, "config.json", token="s3cret", **kw)
        assert Path(path).read_bytes() == published["v2"]["config.json"]
        snapshot_download(REPO, token="s3cret", **kw)


def test_stats_count_body_bytes(published, url, tmp_path):
    hub.hub_stats(url, reset=True)
    hf_hub_download(REPO, MODEL, cache_dir=tmp_path / "cache", endpoint=url)
    hf_hub_download(REPO, "config.json", cache_dir=tmp_path / "cache", endpoint=url)
    stats = hub.hub_stats(url)
    size = len(published["v2"][MODEL]) + len(published["v2"]["config.json"])
    assert stats["total_bytes"] == size  # HEAD requests carry no body
    assert stats["repos"] == {REPO: size}
    assert stats["files"][f"{REPO}/{MODEL}"]["bytes"] == len(published["v2"][MODEL])
    assert hub.hub_stats(url, reset=True)["total_bytes"] == 0


@needs_hf_cli
def test_killed_hf_download_leaves_incomplete_and_rerun_completes(published, url, hf_env, tmp_path):
    dest = tmp_path / "model"
    key = f"{REPO}/{MODEL}"
    hub.set_fault(url, key, bytes_per_second=200_000)  # 2 MB at 200 kB/s: ~10 s, we kill it at once
    proc = subprocess.Popen(
        [str(HF), "download", REPO, "--local-dir", str(dest)],
        env=hf_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (
            (dest / "config.json").exists()
            and hub.hub_stats(url)["files"].get(key, {}).get("bytes", 0) > 0
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "download never got going"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    incomplete = glob.glob(str(dest / ".cache" / "**" / "*.incomplete"), recursive=True)
    assert incomplete, "a killed download leaves its partial file"
    assert not (dest / MODEL).exists()
    assert (dest / "config.json").read_bytes() == published["v2"]["config.json"]

    hub.clear_faults(url)
    hf(hf_env, "download", REPO, "--local-dir", str(dest))
    assert sha256(dest / MODEL) == hashlib.sha256(published["v2"][MODEL]).hexdigest()
    assert hf(hf_env, "cache", "verify", REPO, "--local-dir", str(dest)).returncode == 0


# -- the server process -----------------------------------------------------------------------------


def _serve(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "servefleet.hub", "serve", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_serve_command_lifecycle(published, tmp_path):
    ready, pidfile = tmp_path / "ready", tmp_path / "pid"
    server = _serve("--root", str(published["root"]), "--ready-file", str(ready), "--pidfile", str(pidfile))
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.05)
        url = ready.read_text().split()[0]
        assert pidfile.read_text().strip() == str(server.pid)
        hub.wait_ready(url)
        head = urllib.request.Request(f"{url}/{REPO}/resolve/main/config.json", method="HEAD")
        with urllib.request.urlopen(head) as resp:
            assert resp.headers["X-Repo-Commit"] == published["sha2"]

        # A taken port is refused, not shared; a wildcard address is refused.
        port = url.rsplit(":", 1)[1]
        clash = _serve("--root", str(published["root"]), "--port", port)
        _, err = clash.communicate(timeout=30)
        assert clash.returncode == 1 and "already in use" in err
        wild = _serve("--root", str(published["root"]), "--host", "0.0.0.0")
        _, err = wild.communicate(timeout=30)
        assert wild.returncode == 1 and "wildcard" in err
        hub.wait_ready(url)  # the first server is unaffected
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
    assert server.returncode == 0
    assert f"serving {published['root']} on {url}" in out
    assert not ready.exists() and not pidfile.exists()


def test_api_answers_like_the_hub(published, url):
    with urllib.request.urlopen(f"{url}/api/models/{REPO}/revision/main") as resp:
        info = json.loads(resp.read())
    assert info["sha"] == published["sha2"]
    assert {s["rfilename"] for s in info["siblings"]} == set(published["v2"])
    with urllib.request.urlopen(f"{url}/api/models/{REPO}/tree/{published['sha1']}") as resp:
        top = {e["path"]: e["type"] for e in json.loads(resp.read())}
    assert top == {"docs": "directory", "config.json": "file", "tokenizer.json": "file", MODEL: "file"}
