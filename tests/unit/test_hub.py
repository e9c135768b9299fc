"""The local hub against the REAL huggingface_hub client (in-process and the `hf` CLI).

In-process calls pass endpoint= and cache_dir= explicitly: huggingface_hub reads HF_ENDPOINT and
HF_HOME once, at import. Subprocesses get HF_ENDPOINT/HF_HOME in their environment, as a user would.
"""

import errno
import glob
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.sha import git_hash

from servefleet_dev import hub

REPO = "acme/tiny"
MODEL = "model.safetensors"
HF = Path(sys.executable).with_name("hf")
needs_hf_cli = pytest.mark.skipif(not HF.exists(), reason="hf CLI not installed next to python")
# `servefleet ...` as the console script runs it (the hub command comes through its entry point).
SERVEFLEET_CLI = "import sys; from servefleet.cli import main; sys.exit(main())"


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
    proc = subprocess.run(
        [str(HF), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"hf {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# -- publishing -------------------------------------------------------------------------------------


def test_publish_is_deterministic_and_classifies_lfs(published, tmp_path, url):
    # Same content -> same commit, no new ref movement.
    assert hub.publish(published["root"], REPO, published["src_v2"]) == published["sha2"]
    tree = {
        f.path: f for f in HfApi(endpoint=url).list_repo_tree(REPO, recursive=True, revision="main")
    }
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
        [
            sys.executable,
            "-c",
            SERVEFLEET_CLI,
            "hub",
            "publish",
            REPO,
            str(published["src_v2"]),
            "--root",
            str(root),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == published["sha2"]
    assert (root / "models" / REPO / "refs" / "main").read_text().strip() == out


# -- downloads with the real client -------------------------------------------------------------------


def test_hf_hub_download_at_main_and_at_pinned_sha(published, url, tmp_path):
    cache = tmp_path / "cache"
    latest = hf_hub_download(REPO, "config.json", cache_dir=cache, endpoint=url)
    assert Path(latest).read_bytes() == published["v2"]["config.json"]
    pinned = hf_hub_download(
        REPO, "config.json", revision=published["sha1"], cache_dir=cache, endpoint=url
    )
    assert Path(pinned).read_bytes() == published["v1"]["config.json"]
    assert published["sha1"] in pinned
    weights = hf_hub_download(REPO, MODEL, cache_dir=cache, endpoint=url)
    assert sha256(weights) == hashlib.sha256(published["v2"][MODEL]).hexdigest()
    assert (cache / "models--acme--tiny" / "refs" / "main").read_text() == published["sha2"]


def test_snapshot_download_with_allow_patterns(published, url, tmp_path):
    path = snapshot_download(
        REPO, allow_patterns=["*.json"], cache_dir=tmp_path / "cache", endpoint=url
    )
    assert sorted(p.name for p in Path(path).rglob("*") if p.is_file()) == [
        "config.json",
        "tokenizer.json",
    ]
    assert Path(path).name == published["sha2"]


@needs_hf_cli
def test_hf_download_cli_into_local_dir(published, hf_env, tmp_path):
    dest = tmp_path / "model"
    hf(hf_env, "download", REPO, "--local-dir", str(dest))
    for rel, data in published["v2"].items():
        assert (dest / rel).read_bytes() == data, rel
    assert (
        "All checksums match"
        in hf(hf_env, "cache", "verify", REPO, "--local-dir", str(dest)).stdout
    )


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
    req = urllib.request.Request(
        f"{url}/{REPO}/resolve/main/{MODEL}", headers={"Range": "bytes=1000-"}
    )
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 1000-{len(weights) - 1}/{len(weights)}"
        assert resp.headers["X-Repo-Commit"] == published["sha2"]
        assert resp.read() == weights[1000:]
    req = urllib.request.Request(
        f"{url}/{REPO}/resolve/main/{MODEL}", headers={"Range": f"bytes={len(weights)}-"}
    )
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
        env=hf_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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
        [sys.executable, "-m", "servefleet_dev.hub", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_command_lifecycle(published, tmp_path):
    ready, pidfile = tmp_path / "ready", tmp_path / "pid"
    server = _serve(
        "--root", str(published["root"]), "--ready-file", str(ready), "--pidfile", str(pidfile)
    )
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
    assert top == {
        "docs": "directory",
        "config.json": "file",
        "tokenizer.json": "file",
        MODEL: "file",
    }


# -- hostile and malformed requests ---------------------------------------------------------------


def _raw(url: str, data: bytes, timeout: float = 5.0) -> tuple[str, dict[str, str], bytes]:
    """Send bytes as they are (no client fixes them up); the status line, headers and body back."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(data)
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(65536)  # socket.timeout (a hang) fails the test
            if not chunk:
                break
            raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)
        }
        while len(body) < int(headers.get("content-length", 0)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, headers, body


def _status(url: str, data: bytes, timeout: float = 5.0) -> int:
    status, _, _ = _raw(url, data, timeout)
    assert status.startswith("HTTP/1.1 "), f"no status line: {status[:80]!r}"
    return int(status.split()[1])


CONFIG = f"/{REPO}/resolve/main/config.json".encode()


@pytest.mark.parametrize("value", ["abc", "-1", "+2", "1_0", "2, 2", "\xb2", "9" * 5000])
def test_a_bad_content_length_is_a_400_and_the_server_keeps_serving(url, value, capfd):
    # Was: "abc" and 5000 digits -> 500 with a traceback, "-1" -> the handler read until EOF (hung),
    # "+2" / "1_0" -> accepted, "\xb2" ("²", a digit to str.isdigit) -> 500.
    request = f"POST /_servefleet/faults HTTP/1.1\r\nContent-Length: {value}\r\n\r\n{{}}".encode(
        "latin-1", "replace"
    )
    began = time.monotonic()
    status, headers, body = _raw(url, request)
    assert time.monotonic() - began < 2, "not refused promptly"
    assert status.split()[1] in ("400", "413"), status
    assert headers.get("connection") == "close"  # the body's framing is unknown: no keep-alive
    assert b"Content-Length" in body or b"too large" in body
    assert _status(url, b"GET " + CONFIG + b" HTTP/1.1\r\n\r\n") == 200
    assert "Traceback" not in capfd.readouterr().err


def test_a_negative_content_length_gets_a_400_promptly(url):
    # The request stays open (no EOF): the old handler's rfile.read(-1) waited for one forever.
    began = time.monotonic()
    assert (
        _status(
            url, b"POST /_servefleet/faults HTTP/1.1\r\nContent-Length: -1\r\n\r\n{}", timeout=3
        )
        == 400
    )
    assert time.monotonic() - began < 2


@pytest.mark.parametrize(
    "headers,expected",
    [
        ("Transfer-Encoding: chunked\r\n", 411),
        ("Transfer-Encoding: chunked\r\nContent-Length: 2\r\n", 400),
        ("Content-Length: 2\r\nContent-Length: 3\r\n", 400),
    ],
)
def test_a_body_of_unknown_length_is_refused_and_the_connection_closed(url, headers, expected):
    # Was: the chunked body was left in the stream and read as the next request (smuggling).
    request = f"POST /_servefleet/faults HTTP/1.1\r\n{headers}\r\n2\r\n{{}}\r\n0\r\n\r\n".encode()
    status, response_headers, _ = _raw(url, request)
    assert int(status.split()[1]) == expected
    assert response_headers.get("connection") == "close"


@pytest.mark.parametrize("method", ["FOO", "OPTIONS", "PUT", "get", "TRACE"])
def test_a_method_the_hub_does_not_serve_is_a_405(url, method):
    # Was: 501 Not Implemented for every method without a do_X.
    status, headers, _ = _raw(
        url, f"{method} /{REPO}/resolve/main/config.json HTTP/1.1\r\n\r\n".encode()
    )
    assert status.startswith("HTTP/1.1 405"), status
    assert headers["allow"] == "GET, HEAD, POST, DELETE"


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 60000,  # was a RecursionError -> 500
        b'{"bytes_per_second": Infinity}',  # was an OverflowError -> 500
        b'{"drop_after": 1.5}',
        b'{"times": 0}',
        b'{"times": true}',
        b'{"pattern": ["*"]}',
        b"null",
        b"\xff\xfe",
    ],
)
def test_a_hostile_fault_rule_is_a_400(url, body, capfd):
    request = b"POST /_servefleet/faults HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    status, _, answer = _raw(url, request)
    assert status.startswith("HTTP/1.1 400"), status
    assert b"bad fault rule" in answer
    assert hub.set_fault(url, "x/y/*", times=1) == [
        {"pattern": "x/y/*", "bytes_per_second": None, "drop_after": None, "times": 1}
    ]
    hub.clear_faults(url)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "value,expected",
    [
        ("bytes=0-0", 206),
        ("bytes=0-" + "9" * 5000, 206),
        ("bytes=-" + "9" * 5000, 206),
        ("bytes=0-0,2-3", 200),
        ("items=0-1", 200),  # multi-ranges and other units: the whole file
        (
            "bytes=" + "9" * 5000 + "-",
            416,
        ),  # was: int() refused 5000 digits, the whole file came back
        ("bytes=+0-", 416),
        ("bytes=1_0-", 416),
        ("bytes=0--1", 416),
        ("bytes=--1", 416),
        ("bytes=-0", 416),
        ("bytes=3-1", 416),
        ("bytes=abc", 416),
        ("bytes=", 416),
        ("bytes=-", 416),
    ],
)
def test_range_headers(published, url, value, expected):
    status, headers, _ = _raw(
        url, b"GET " + CONFIG + f" HTTP/1.1\r\nRange: {value}\r\n\r\n".encode()
    )
    assert int(status.split()[1]) == expected, status
    if expected == 416:
        assert headers["content-range"] == f"bytes */{len(published['v2']['config.json'])}"


@pytest.mark.parametrize(
    "target,code",
    [
        (f"/{REPO}/resolve/main/..%2F..%2Frefs%2Fmain", "EntryNotFound"),
        (f"/{REPO}/resolve/main/../../refs/main", "EntryNotFound"),
        (f"/{REPO}/resolve/main/%2Fetc%2Fpasswd", "EntryNotFound"),
        (f"/{REPO}/resolve/main/%ff%00.json", "EntryNotFound"),
        (f"/{REPO}/resolve/..%2F..%2Fcommits/config.json", "RevisionNotFound"),
        (f"/{REPO}/resolve/%2e%2e/config.json", "RevisionNotFound"),
        ("/acme/../resolve/main/config.json", "RepoNotFound"),
        ("/%2e%2e/%2e%2e/resolve/main/config.json", "RepoNotFound"),
        ("/acme/ti..ny/resolve/main/config.json", "RepoNotFound"),
        (f"/api/models/{REPO}/tree/main/..%2F..", "EntryNotFound"),
    ],
)
def test_traversal_in_names_is_a_404_naming_what_is_absent(url, target, code):
    status, headers, _ = _raw(url, f"GET {target} HTTP/1.1\r\n\r\n".encode())
    assert status.startswith("HTTP/1.1 404") and headers["x-error-code"] == code, (status, headers)
    status, headers, _ = _raw(
        url, b"GET " + target.encode() + b"\xff\xfe HTTP/1.1\r\n\r\n"
    )  # raw non-UTF-8
    assert status.startswith("HTTP/1.1 404"), status


@pytest.mark.parametrize(
    "request_line,expected",
    [
        (b"GET / HTTP/2.0", 505),
        (b"GET / HTTP/x.y", 400),
        (b"GET http://[::1/x HTTP/1.1", 400),
    ],
)
def test_a_bad_request_line_is_answered_with_a_status_line(url, request_line, expected):
    # Was: the stdlib answered a bad version with a bare HTML body (no status line, as HTTP/0.9).
    assert _status(url, request_line + b"\r\n\r\n") == expected


def test_oversized_request_lines_and_headers_are_4xx(url):
    assert _status(url, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n") == 414
    assert _status(url, b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n") == 431
    assert (
        _status(
            url, b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"
        )
        == 431
    )


def test_a_client_resetting_mid_request_leaves_no_traceback(url, capfd):
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    for partial in (
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: ",
        b"POST /_servefleet/faults HTTP/1.1\r\nContent-Length: 99\r\n\r\n{",
    ):
        sock = socket.create_connection((host, port))
        sock.sendall(partial)
        time.sleep(0.2)  # the handler is reading the rest
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        sock.close()
    time.sleep(0.3)
    hub.wait_ready(url)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        "::",
        "::ffff:0.0.0.0",
        "::ffff:0:0",
        "0:0:0:0:0:ffff:0:0",
        "::0.0.0.0",
        "::%lo",
        "::ffff:0.0.0.0%lo",
        "0",
        "0.0.0.0%eth0",
        "[::]",
        "[::1]",
        "0x0",
        "000.000.000.000",
        "127.1",
        "",
        "224.0.0.1",
        "ff02::1",
        "255.255.255.255",
        "::ffff:255.255.255.255",
        "localhost",
    ],
)
def test_check_address_refuses_wildcards_in_any_spelling(host):
    # Was: "::ffff:0.0.0.0" (a dual-stack socket's IPv4 wildcard) and multicast/broadcast passed.
    with pytest.raises(hub.AddressError) as err:
        hub.check_address(host, 0)
    assert err.value.errno == errno.EINVAL


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_check_address_refuses_ports_out_of_range(port):
    # Was: an OverflowError traceback from the port probe.
    with pytest.raises(hub.AddressError, match="0-65535"):
        hub.check_address("127.0.0.1", port)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
def test_check_address_accepts_loopback_spellings(published, host):
    hub.check_address(host, 0)  # no AddressError...
    # ...and a hub started on that spelling serves on it, as a client reaches it.
    with hub.running_hub(published["root"], host=host) as url:
        assert urllib.parse.urlsplit(url).hostname == host
        assert _status(url, b"GET " + CONFIG + b" HTTP/1.1\r\n\r\n") == 200
