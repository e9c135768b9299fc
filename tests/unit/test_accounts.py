"""The service accounts are servefleet's own (core.node.account_problem): read with the real
Account fact on this machine's accounts and groups, and on getent lines as a node prints them."""

from __future__ import annotations

import subprocess

import pytest

from servefleet.core.node import OWN_ACCOUNT, account_problem, parse_account
from servefleet.facts import batch
from servefleet.facts.node import Account

HOME, SHELL = "/opt/servefleet/cache", "/usr/sbin/nologin"


def read(name: str) -> dict:
    """The Account fact for `name`, run here with the node's shell, as pyinfra would."""
    out = subprocess.run(
        ["sh", "-c", batch.command_of(Account, {"user": name, "group": name})],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_account(out.splitlines())


def node(passwd: str | None, group: str | None, groups: str | None = None) -> dict:
    lines = [f"passwd:{passwd}"] if passwd else []
    lines += [f"group:{group}"] if group else []
    lines += [f"groups:{groups}"] if groups else []
    return parse_account(lines)


def test_a_name_that_no_account_or_group_has_is_servefleets_to_create():
    found = read("sf-no-such-account-here")
    assert found == {"user": None, "group": None, "groups": []}
    assert account_problem("servefleet_user", "sf-no-such-account-here", found, HOME, SHELL) is None


@pytest.mark.parametrize(
    "name,what",
    [
        ("root", "an account 'root' (uid 0)"),
        ("daemon", "an account 'daemon' (uid 1)"),
        ("nobody", "an account 'nobody'"),
    ],
)
def test_an_account_of_the_system_is_refused(name, what):
    found = read(name)
    assert found["user"] is not None, f"this machine has no {name}"
    problem = account_problem("servefleet_user", name, found, HOME, SHELL)
    assert problem.startswith(f"key 'servefleet_user' = {name!r}: {what}"), problem
    assert "is not servefleet's" in problem and "\n" not in problem


@pytest.mark.parametrize("name", ["video", "staff", "systemd-journal", "root"])
def test_a_group_that_exists_is_refused_even_without_an_account_of_its_name(name):
    found = read(name)
    if name != "root":
        assert found["user"] is None and found["group"] is not None, found
    problem = account_problem("servefleet_user", name, found, HOME, SHELL)
    assert problem and "is not servefleet's" in problem, problem


def test_servefleets_own_account_is_kept():
    found = node(
        f"servefleet:x:998:998:{OWN_ACCOUNT}:{HOME}:{SHELL}", "servefleet:x:998:", "servefleet"
    )
    assert account_problem("servefleet_user", "servefleet", found, HOME, SHELL) is None


def test_an_account_that_an_earlier_servefleet_made_is_adopted_once():
    # No comment (today's version set none), its own group, the home and shell servefleet gives.
    found = node(f"servefleet:x:998:998::{HOME}:{SHELL}", "servefleet:x:998:", "servefleet")
    assert account_problem("servefleet_user", "servefleet", found, HOME, SHELL) is None
    # Without a comment and with another home or shell, it is someone else's.
    for passwd in (
        f"servefleet:x:998:998::/home/servefleet:{SHELL}",
        f"servefleet:x:998:998::{HOME}:/bin/bash",
    ):
        problem = account_problem(
            "servefleet_user", "servefleet", node(passwd, "servefleet:x:998:"), HOME, SHELL
        )
        assert "an account 'servefleet' (uid 998) exists" in problem, problem


@pytest.mark.parametrize(
    "groups,group,named",
    [
        ("servefleet docker", "servefleet:x:998:", "docker"),  # a supplementary group
        ("servefleet", "servefleet:x:998:alice", "alice"),  # its group has a member
        ("servefleet video render", "servefleet:x:998:", "render, video"),
    ],
)
def test_an_own_account_with_group_power_is_refused(groups, group, named):
    found = node(f"servefleet:x:998:998:{OWN_ACCOUNT}:{HOME}:{SHELL}", group, groups)
    problem = account_problem("servefleet_user", "servefleet", found, HOME, SHELL)
    assert problem and f"({named})" in problem and "in no group but its own" in problem, problem


def test_an_own_account_whose_primary_group_is_another_is_refused():
    found = node(f"servefleet:x:998:44:{OWN_ACCOUNT}:{HOME}:{SHELL}", "servefleet:x:998:", "video")
    problem = account_problem("servefleet_user", "servefleet", found, HOME, SHELL)
    assert "primary group is not its own group 'servefleet'" in problem, problem
    found = node(f"servefleet:x:998:44:{OWN_ACCOUNT}:{HOME}:{SHELL}", None, "video")
    assert "primary group" in account_problem("servefleet_user", "servefleet", found, HOME, SHELL)
