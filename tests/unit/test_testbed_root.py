"""The testbed is root's (#30): as another user, every testbed command and the demo say "needs
root" in one line and exit 2, before anything is read or started (was: `testbed status`
printed an empty table, exit 0, and `up` failed half-way with advice that did not help). The
real command in-process, with the process's effective uid seen as an unprivileged user's."""

import os

import pytest

from servefleet.cli import main
from servefleet_dev.testbed import lifecycle

ACTIONS = [
    ["testbed", "up"],
    ["testbed", "add", "spark-2"],
    ["testbed", "rm", "spark-2"],
    ["testbed", "status"],
    ["testbed", "status", "--json"],
    ["testbed", "ssh", "spark-1"],
    ["testbed", "down"],
    ["demo"],
]


@pytest.fixture
def unprivileged(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("SERVEFLEET_CACHE", str(tmp_path))  # nothing of root's is read

    def touched(*args, **kwargs):
        raise AssertionError("the testbed was touched")

    for name in ("up", "add", "rm", "status", "down"):
        monkeypatch.setattr(lifecycle, name, touched)


@pytest.mark.parametrize("argv", ACTIONS, ids=" ".join)
def test_a_testbed_command_as_another_user_needs_root(unprivileged, capsys, argv):
    assert main(argv) == 2
    out = capsys.readouterr()
    command = "servefleet " + (" ".join(argv[:2]) if argv[0] == "testbed" else "demo")
    assert out.out == ""
    assert out.err == (
        f"{command}: needs root (systemd-nspawn guests, network namespaces; the testbed's "
        f"state is root's); run it as root: sudo {command}\n"
    )
