"""#27 rule 2, the node side: a directory servefleet makes its own (servefleet_root, a moved
models root or depot store) is absent or servefleet's, under directories only root writes.
The decision (servefleet.core.node.own_dir_problem) on the PathChain fact's real output: the
fact's command run here as root on directories made for the purpose, then removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from servefleet.core.layout import NodeLayout
from servefleet.core.node import own_dir_problem
from servefleet.facts import batch
from servefleet.facts.node import PathChain

NOBODY = 65534


def _chain(path: str):
    out = subprocess.run(
        ["sh", "-c", batch.command_of(PathChain, {"path": path})],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return PathChain().process(out.splitlines())


def problem(path: str, earlier: bool = False, key: str = "servefleet_root") -> str | None:
    marker = NodeLayout.own_marker(path)
    return own_dir_problem(key, path, marker, _chain(marker), earlier)


@pytest.fixture
def base():
    """A root-only directory (0700 root under /var/cache) to make places in."""
    os.makedirs("/var/cache", exist_ok=True)
    path = tempfile.mkdtemp(prefix="sf-own-", dir="/var/cache")
    yield path
    shutil.rmtree(path)


def _mark(path: str, uid: int = 0, mode: int = 0o644) -> None:
    with open(NodeLayout.own_marker(path), "w"):
        pass
    os.chown(NodeLayout.own_marker(path), uid, uid)
    os.chmod(NodeLayout.own_marker(path), mode)


def test_a_directory_not_made_yet_under_roots_passes(base):
    assert problem(f"{base}/servefleet") is None
    assert problem(f"{base}/a/b/servefleet") is None  # root makes the missing parents too


def test_a_directory_with_roots_mark_passes(base):
    os.mkdir(f"{base}/sf")
    _mark(f"{base}/sf")
    assert problem(f"{base}/sf") is None
    os.chown(f"{base}/sf", NOBODY, NOBODY)  # a models root: the service user's, root's mark
    assert problem(f"{base}/sf", key="models_root") is None


def test_an_existing_directory_without_the_mark_is_someone_elses(base):
    os.mkdir(f"{base}/docker")
    found = problem(f"{base}/docker")
    assert found.startswith(
        f"key 'servefleet_root' = '{base}/docker': {base}/docker exists on "
        f"this node and is not servefleet's (no .servefleet-own"
    )
    assert "\n" not in found
    assert problem(f"{base}/docker", earlier=True) is None  # an earlier servefleet's: adopted


@pytest.mark.parametrize(
    "uid, mode, kind",
    [(NOBODY, 0o644, "owned by nobody"), (0, 0o666, "mode 0666"), (0, 0o664, "mode 0664")],
)
def test_a_mark_another_user_wrote_or_may_change_is_no_mark(base, uid, mode, kind):
    os.mkdir(f"{base}/sf")
    _mark(f"{base}/sf", uid, mode)
    found = problem(f"{base}/sf", earlier=True)  # not even adopted: the mark says otherwise
    assert found is not None and kind in found and "not root's mark" in found, found


def test_a_mark_that_is_a_link_or_a_directory_is_refused(base):
    os.mkdir(f"{base}/sf")
    os.symlink("/etc/hostname", NodeLayout.own_marker(f"{base}/sf"))
    assert "is a symbolic link" in problem(f"{base}/sf")
    os.unlink(NodeLayout.own_marker(f"{base}/sf"))
    os.mkdir(NodeLayout.own_marker(f"{base}/sf"))
    assert "its .servefleet-own is a directory" in problem(f"{base}/sf")


def test_a_file_where_the_directory_should_be_is_refused(base):
    open(f"{base}/sf", "w").close()
    assert problem(f"{base}/sf") == (
        f"key 'servefleet_root' = '{base}/sf': it is a regular "
        f"empty file on this node, not a directory"
    )


def test_a_world_writable_or_others_directory_above_is_refused(base):
    os.mkdir(f"{base}/scratch")
    os.chmod(f"{base}/scratch", 0o1777)
    found = problem(f"{base}/scratch/servefleet")
    assert f"{base}/scratch above it is owned by root (uid 0), mode 1777" in found, found
    os.chmod(f"{base}/scratch", 0o755)
    os.chown(f"{base}/scratch", NOBODY, NOBODY)
    assert "owned by nobody (uid 65534)" in problem(f"{base}/scratch/servefleet")
    os.chown(f"{base}/scratch", 0, 0)
    assert problem(f"{base}/scratch/servefleet") is None


def test_a_link_above_or_at_the_directory_is_refused(base):
    os.mkdir(f"{base}/real")
    os.symlink(f"{base}/real", f"{base}/link")
    found = problem(f"{base}/link/servefleet")
    assert f"{base}/link is a symbolic link" in found, found
    _mark(f"{base}/real")
    assert f"{base}/link is a symbolic link" in problem(f"{base}/link", earlier=True)


def test_what_was_not_read_fails_closed():
    assert "cannot read the owner and mode" in own_dir_problem(
        "servefleet_root", "/opt/sf", "/opt/sf/.servefleet-own", None, True
    )
