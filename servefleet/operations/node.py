"""Operations every node gets: preflight, OS packages, the service account, services, a visible
no-op; fail_host and run, which the other operations use.

pyinfra inventory/testbed.py servefleet.operations.node.preflight data='{...}'
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.operations import apt

from servefleet.core.node import OWN_ACCOUNT, account_problem, node_problems
from servefleet.facts import batch
from servefleet.facts.node import (
    Account,
    CpuArch,
    FreeDiskBytes,
    InstalledDebs,
    NvidiaGpus,
)
from servefleet.facts.systemd import UnitState


def fail_host(message: str):
    """A command that fails this host only, with the message on stderr (other hosts go on).

    Raising instead would abort the whole run while pyinfra prepares operations.
    """
    return StringCommand(f"echo {shlex.quote('servefleet: ' + message)} >&2; exit 1")


def connector_args(target) -> dict:
    """How `target` runs privileged commands (its `_sudo`, `_sudo_user`, ... from data)."""
    args, _ = pop_global_arguments(target.state, target, {})
    return {k: v for k, v in args.items() if k in CONNECTOR_ARGUMENT_KEYS}


def run(target, command, privileged: bool = True):
    """Run a command on `target` outside an operation, with sudo where its data says so.
    Returns (ok, stdout, stderr)."""
    kwargs = connector_args(target) if privileged else {}
    ok, output = target.run_shell_command(command, **kwargs)
    return ok, output.stdout, output.stderr


@operation()
def preflight(data: dict, accounts: tuple = ()):
    """
    Check that the node can run its recipe: CPU architecture, NVIDIA GPU and driver, free disk,
    and that the accounts it makes its own are its own (core.node.account_problem).

    + data: the recipe values to check against (``host.data`` as a dict)
    + accounts: ``(data key, account, home, shell)`` of each account the recipe makes

    A failed check fails this host with every problem named; it changes nothing.

    **Example:**

    .. code:: python

        node.preflight(data=host.data.dict())
    """
    problems = node_problems(
        arch=batch.get(host, CpuArch),
        gpus=batch.get(host, NvidiaGpus),
        free_disk=batch.get(host, FreeDiskBytes, path=data["servefleet_root"]),
        data=data,
    )
    for key, user, home, shell in accounts:
        found = batch.get(host, Account, user=user, group=user)
        problem = account_problem(key, user, found, home, shell)
        if problem:
            problems.append(problem)
    if problems:
        yield fail_host(f"preflight failed on {host.name}: " + "; ".join(problems))
    else:
        host.noop(f"preflight passed on {host.name}")


@operation()
def os_packages(packages: list[str], query: tuple[str, ...] = ()):
    """
    Install apt packages, refreshing the package lists only when something is missing.

    + packages: Debian/Ubuntu package names
    + query: the names to ask dpkg about (default: ``packages``). A recipe passes every distro
      family's names, so the read does not depend on the family and can be batched with the
      node's other facts (servefleet.facts.batch).

    ``apt.packages(update=True)`` would refresh the lists on every run and count as a change.

    **Example:**

    .. code:: python

        node.os_packages(packages=["git", "rsync"])
    """
    names = tuple(query) or tuple(sorted(set(packages)))
    installed = batch.get(host, InstalledDebs, names=names)
    missing = [p for p in packages if p not in installed]
    if not missing:
        host.noop(f"OS packages present: {', '.join(packages)}")
        return
    yield from apt.update._inner()
    # Wait for a dpkg lock held by e.g. unattended-upgrades at boot instead of failing.
    yield from apt.packages._inner(
        packages=missing, no_recommends=True, extra_install_args="-o DPkg::Lock::Timeout=300"
    )
    batch.forget(host)


@operation()
def account(user: str, home: str, shell: str = "/usr/sbin/nologin"):
    """
    A system account ``user`` with a system group of the same name as its primary group, the
    given home (not created) and shell, marked as servefleet's (its comment: OWN_ACCOUNT). An
    account or group that is not servefleet's fails this host, unchanged
    (core.node.account_problem; the preflight refuses it first).

    + user: the account (and its group's) name
    + home: its home directory (made elsewhere, with the owner and mode it needs)
    + shell: its login shell

    **Example:**

    .. code:: python

        node.account(user="servefleet", home="/opt/servefleet/cache")
    """
    found = batch.get(host, Account, user=user, group=user)
    problem = account_problem("account", user, found, home, shell)
    if problem:
        yield fail_host(f"{host.name}: {problem}")
        return
    group, passwd = found.get("group"), found.get("user")
    if (
        group
        and passwd
        and passwd["gid"] == group["gid"]
        and passwd["home"] == home
        and passwd["shell"] == shell
        and passwd["gecos"] == OWN_ACCOUNT
    ):
        host.noop(f"account {user} (group {user}, home {home}, shell {shell})")
        return
    if not group:
        yield StringCommand("groupadd", "--system", shlex.quote(user))
    flags = [
        "--gid",
        shlex.quote(user),
        "--shell",
        shlex.quote(shell),
        "--comment",
        shlex.quote(OWN_ACCOUNT),
    ]
    if passwd:  # usermod spells it --home, useradd --home-dir
        yield StringCommand("usermod", *flags, "--home", shlex.quote(home), shlex.quote(user))
    else:
        yield StringCommand(
            "useradd",
            "--system",
            "--no-create-home",
            *flags,
            "--home-dir",
            shlex.quote(home),
            shlex.quote(user),
        )
    batch.forget(host)


@operation()
def service(unit: str, running: bool = True, enabled: bool = True):
    """
    A systemd unit running (or stopped) and enabled (or not), as data says.

    + unit: the unit, e.g. ``servefleet-llama.service``
    + running: started when inactive; False: stopped when active
    + enabled: enabled at boot; False: disabled

    pyinfra's ``systemd.service`` reads the state in two commands of its own; this reads the
    unit's one ``systemctl show`` (facts.systemd.UnitState), which a recipe plans with its other
    reads (servefleet.facts.batch).

    **Example:**

    .. code:: python

        node.service(unit="servefleet-llama.service", running=True, enabled=True)
    """
    state = batch.get(host, UnitState, unit=unit)
    quoted = shlex.quote(unit)
    if running and not state["active"]:
        yield StringCommand("systemctl", "start", quoted)
    elif not running and state["active"]:
        yield StringCommand("systemctl", "stop", quoted)
    if enabled and not state["enabled"]:
        yield StringCommand("systemctl", "enable", quoted)
    elif not enabled and state["enabled"]:
        yield StringCommand("systemctl", "disable", quoted)
    if state["active"] == running and state["enabled"] == enabled:
        host.noop(
            f"{unit} is {'running' if running else 'stopped'}, "
            f"{'enabled' if enabled else 'disabled'}"
        )


@operation()
def skip(reason: str):
    """
    Do nothing on this host, visibly: a recipe run on a host of another role.

    + reason: shown as the operation's name in pyinfra's results

    **Example:**

    .. code:: python

        node.skip(name="serve_bf16 acts on spark hosts only", reason="rtx4090-1 is rtx4090")
    """
    host.noop(reason)
    return
    yield  # a generator that yields nothing: no change
