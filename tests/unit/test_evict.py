"""The page-cache eviction walks the engine's tree (the models root) as the tree's owner and
follows no symlink: a planted link to /etc is not opened, a link loop is not entered, a FIFO
does not hang it, and root only writes the record."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "files/pagecache/evict.py"
NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def tree():
    """A model tree that `nobody` can read (pytest's tmp_path is root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="servefleet-evict-"))
    base.chmod(0o755)
    model = base / "model"
    model.mkdir()
    (model / "a.safetensors").write_bytes(b"\1" * (1 << 20))
    (model / "a.safetensors").chmod(0o644)
    # The service user's own file, as the fetcher leaves it: mincore(2) reports residency only
    # for files the caller owns or may write (Linux >= 5.2), so ownership matters here.
    os.chown(model / "a.safetensors", NOBODY, -1)
    yield base, model
    shutil.rmtree(base)


def evict(*args, timeout=30):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_eviction_runs_as_the_owner_and_follows_no_symlink(tree):
    base, model = tree
    (model / "etc").symlink_to("/etc")  # a planted link into root's world
    (model / "loop").symlink_to(".")  # a loop
    (model / "shadow.safetensors").symlink_to("/etc/shadow")
    os.mkfifo(model / "pipe.safetensors")  # would hang a blocking open
    (model / "a.safetensors").read_bytes()
    record = base / "record.json"
    done = evict(model, "--user", "nobody", "--record", record)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == json.loads(record.read_text())
    assert (report["files"], report["bytes"]) == (1, 1 << 20)  # a.safetensors only
    assert report["resident_after"] == 0
    assert record.stat().st_uid == 0  # the record is root's


def test_eviction_as_the_owner_cannot_read_what_only_root_reads(tree):
    base, model = tree
    secret = model / "root-only.safetensors"
    secret.write_bytes(b"\2" * 4096)
    secret.chmod(0o600)  # root's: nobody cannot open it, so it is not counted
    done = evict(model, "--user", "nobody")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"] == 1


def test_an_unknown_user_is_one_line_and_no_record(tree):
    base, model = tree
    record = base / "record.json"
    done = evict(model, "--user", "no-such-user-here", "--record", record)
    assert done.returncode == 1
    assert done.stderr.startswith("evict: ") and len(done.stderr.strip().splitlines()) == 1
    assert not record.exists()


def test_a_symlinked_tree_is_refused(tree):
    base, model = tree
    (base / "link").symlink_to(model)
    done = evict(base / "link")
    assert done.returncode == 2 and "is not a directory" in done.stderr
