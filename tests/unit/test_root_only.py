"""The node side of "root never installs from, runs or compiles with what another user can
write": the PathChain fact's output parsed, and the decision on it (servefleet.core.node).

The outputs are real: the fact's command (servefleet.facts.node.PathChain) run as root on
Debian 12 (GNU coreutils 9.1) on paths made for the purpose (a directory of nobody's, a
group-writable one, a root-owned symlink into /tmp), then removed.
"""

from __future__ import annotations

import subprocess

import pytest

from servefleet.core.node import others_may_write, parse_path_chain, root_only_problem
from servefleet.facts import batch
from servefleet.facts.node import PathChain

# /usr/bin/python3 as the PathChain fact read it on a testbed guest of each Debian release: a
# link to that release's own python3.X (what the node reports; the link's own 777 means nothing,
# its target is root's).
PYTHON3 = {
    "bookworm": """\
W|symbolic link|0|root|777|/usr/bin/python3
W|directory|0|root|755|/usr/bin
W|directory|0|root|755|/usr
W|directory|0|root|755|/
R|regular file|0|root|755|/usr/bin/python3.11
R|directory|0|root|755|/usr/bin
R|directory|0|root|755|/usr
R|directory|0|root|755|/
""",
    "trixie": """\
W|symbolic link|0|root|777|/usr/bin/python3
W|directory|0|root|755|/usr/bin
W|directory|0|root|755|/usr
W|directory|0|root|755|/
R|regular file|0|root|755|/usr/bin/python3.13
R|directory|0|root|755|/usr/bin
R|directory|0|root|755|/usr
R|directory|0|root|755|/
""",
}

REAL = {
    "/usr/bin/python3": PYTHON3["bookworm"],
    # Not made yet: judged by the directories above it (root makes it).
    "/var/cache/sf-demo/missing/uv": """\
W|directory|0|root|755|/var/cache/sf-demo
W|directory|0|root|755|/var/cache
W|directory|0|root|755|/var
W|directory|0|root|755|/
R|directory|0|root|755|/var/cache/sf-demo
R|directory|0|root|755|/var/cache
R|directory|0|root|755|/var
R|directory|0|root|755|/
""",
    "/tmp/sf-demo-target/uv": """\
W|directory|0|root|755|/tmp/sf-demo-target/uv
W|directory|0|root|755|/tmp/sf-demo-target
W|directory|0|root|1777|/tmp
W|directory|0|root|755|/
R|directory|0|root|755|/tmp/sf-demo-target/uv
R|directory|0|root|755|/tmp/sf-demo-target
R|directory|0|root|1777|/tmp
R|directory|0|root|755|/
""",
    "/var/cache/sf-demo/owned": """\
W|directory|65534|nobody|755|/var/cache/sf-demo/owned
W|directory|0|root|755|/var/cache/sf-demo
W|directory|0|root|755|/var/cache
W|directory|0|root|755|/var
W|directory|0|root|755|/
R|directory|65534|nobody|755|/var/cache/sf-demo/owned
R|directory|0|root|755|/var/cache/sf-demo
R|directory|0|root|755|/var/cache
R|directory|0|root|755|/var
R|directory|0|root|755|/
""",
    "/var/cache/sf-demo/grp/uv": """\
W|directory|0|root|755|/var/cache/sf-demo/grp/uv
W|directory|0|root|775|/var/cache/sf-demo/grp
W|directory|0|root|755|/var/cache/sf-demo
W|directory|0|root|755|/var/cache
W|directory|0|root|755|/var
W|directory|0|root|755|/
R|directory|0|root|755|/var/cache/sf-demo/grp/uv
R|directory|0|root|775|/var/cache/sf-demo/grp
R|directory|0|root|755|/var/cache/sf-demo
R|directory|0|root|755|/var/cache
R|directory|0|root|755|/var
R|directory|0|root|755|/
""",
    # A root-owned link in a root-only directory, pointing into /tmp: fine as written, not
    # where it leads.
    "/var/cache/sf-demo/link/uv": """\
W|directory|0|root|755|/var/cache/sf-demo/link/uv
W|symbolic link|0|root|777|/var/cache/sf-demo/link
W|directory|0|root|755|/var/cache/sf-demo
W|directory|0|root|755|/var/cache
W|directory|0|root|755|/var
W|directory|0|root|755|/
R|directory|0|root|755|/tmp/sf-demo-target/uv
R|directory|0|root|755|/tmp/sf-demo-target
R|directory|0|root|1777|/tmp
R|directory|0|root|755|/
""",
}


def problem(path: str, key: str = "uv_cache_dir") -> str | None:
    return root_only_problem(key, path, parse_path_chain(REAL[path].splitlines()))


@pytest.mark.parametrize("release", sorted(PYTHON3))
def test_the_chain_parses(release):
    capture = PYTHON3[release].splitlines()
    chains = parse_path_chain(capture)
    assert [e["path"] for e in chains["W"]] == ["/usr/bin/python3", "/usr/bin", "/usr", "/"]
    assert chains["R"][0] == {
        "type": "regular file",
        "uid": 0,
        "user": "root",
        "mode": "755",
        "path": capture[4].rsplit("|", 1)[1],  # the release's python3.X, as the node read it
    }
    assert chains["R"][0]["path"].startswith("/usr/bin/python3.")
    assert root_only_problem("python_interpreter", "/usr/bin/python3", chains) is None


@pytest.mark.parametrize("path", ["/usr/bin/python3", "/var/cache/sf-demo/missing/uv"])
def test_root_only_paths_pass(path):
    assert problem(path) is None


@pytest.mark.parametrize(
    "path, expected",
    [
        (
            "/tmp/sf-demo-target/uv",
            "uv_cache_dir = /tmp/sf-demo-target/uv: /tmp is owned by root "
            "(uid 0), mode 1777 (directory)",
        ),
        (
            "/var/cache/sf-demo/owned",
            "uv_cache_dir = /var/cache/sf-demo/owned: it is owned by nobody "
            "(uid 65534), mode 0755 (directory)",
        ),
        (
            "/var/cache/sf-demo/grp/uv",
            "uv_cache_dir = /var/cache/sf-demo/grp/uv: "
            "/var/cache/sf-demo/grp is owned by root (uid 0), mode 0775",
        ),
        (
            "/var/cache/sf-demo/link/uv",
            "uv_cache_dir = /var/cache/sf-demo/link/uv: /tmp is owned by root (uid 0), mode 1777",
        ),
    ],
)
def test_what_another_user_can_change_is_named_in_one_line(path, expected):
    found = problem(path)
    assert found.startswith(expected), found
    assert "\n" not in found and "must be root's and writable by root only" in found


def test_what_was_not_read_fails_closed():
    assert parse_path_chain([]) is None
    lines = REAL["/usr/bin/python3"].splitlines()
    assert parse_path_chain(lines[:3] + lines[4:]) is None  # the written chain stops short of /
    assert parse_path_chain(lines + ["a stray line"]) is None
    assert parse_path_chain([ln.replace("|755|", "|7x5|") for ln in lines]) is None
    assert "cannot read the owner and mode" in root_only_problem("uv_cache_dir", "/x", None)


def test_sticky_and_symlink_rules():
    assert others_may_write({"type": "directory", "uid": 0, "mode": "1777"})  # /tmp
    assert others_may_write({"type": "directory", "uid": 0, "mode": "2770"})  # group-writable
    assert not others_may_write({"type": "directory", "uid": 0, "mode": "1755"})
    assert not others_may_write({"type": "symbolic link", "uid": 1000, "mode": "777"})
    assert others_may_write({"type": "regular file", "uid": 1000, "mode": "755"})


def _read(path: str):
    """The fact run here, as pyinfra's get_fact runs it (its stdout through its parser)."""
    out = subprocess.run(
        ["sh", "-c", batch.command_of(PathChain, {"path": path})],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return PathChain().process(out.splitlines())


def test_the_fact_reads_this_machine(tmp_path):
    usr = _read("/usr")
    assert [e["path"] for e in usr["W"]] == ["/usr", "/"] and usr["W"] == usr["R"]
    (tmp_path / "a|b").mkdir()
    below = _read(str(tmp_path / "a|b" / "not-yet"))
    assert below["W"][0]["path"] == str(tmp_path / "a|b")  # a | in a name stays in the path
    # pytest's tmp_path lies under the sticky, world-writable /tmp (or another user's dir)
    assert root_only_problem("uv_cache_dir", str(tmp_path), _read(str(tmp_path))) is not None
