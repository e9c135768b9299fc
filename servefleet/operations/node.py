"""Operations every node gets: preflight, OS packages, a visible no-op, secret files.

pyinfra inventory/testbed.py servefleet.operations.node.preflight data='{...}'
"""

from __future__ import annotations

import hashlib
import io
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import apt

from servefleet.core.node import OWN_ACCOUNT, account_problem, node_problems
from servefleet.facts import batch
from servefleet.facts.node import (
    Account,
    CpuArch,
    FreeDiskBytes,
    InstalledDebs,
    NvidiaGpus,
    PathStat,
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
def owned_file(path: str, user: str = "root", group: str = "root", mode: str = "644"):
    """
    A regular file (created empty when missing) with this owner, group and mode.

    + path: the file
    + user, group: its owner
    + mode: its permission bits, octal (``"644"``)

    Anything else at ``path`` (a directory, a symlink) fails this host.

    **Example:**

    .. code:: python

        node.owned_file(path="/opt/servefleet/venvs/vllm-0.24.0/.lock", mode="644")
    """
    found = batch.get(host, PathStat, path=path)
    if found and found["type"] not in ("regular file", "regular empty file"):
        yield fail_host(f"{path} on {host.name} is a {found['type']}, not a regular file")
        return
    if (
        found
        and (found["user"], found["group"]) == (user, group)
        and _mode(found["mode"]) == _mode(mode)
    ):
        host.noop(f"{path} is a file ({user}:{group} {mode})")
        return
    quoted = shlex.quote(path)
    if not found:
        yield StringCommand("touch", "--", quoted)
    yield StringCommand("chown", shlex.quote(f"{user}:{group}"), "--", quoted)
    yield StringCommand("chmod", shlex.quote(mode), "--", quoted)


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


def _mode(text) -> int:
    return int(str(text), 8)


@operation()
def directory(path: str, user: str = "root", group: str = "root", mode: str = "755"):
    """
    A directory with this owner, group and mode (created with its parents when missing).

    + path: the directory
    + user, group: its owner
    + mode: its permission bits, octal (``"755"``)

    Anything else at ``path`` (a file, a symlink) fails this host: replacing it could follow a
    link out of the tree.

    **Example:**

    .. code:: python

        node.directory(path="/opt/servefleet/models", user="servefleet", group="servefleet")
    """
    found = batch.get(host, PathStat, path=path)
    if found and found["type"] != "directory":
        yield fail_host(f"{path} on {host.name} is a {found['type']}, not a directory")
        return
    if (
        found
        and (found["user"], found["group"]) == (user, group)
        and _mode(found["mode"]) == _mode(mode)
    ):
        host.noop(f"{path} is a directory ({user}:{group} {mode})")
        return
    quoted = shlex.quote(path)
    if not found:
        yield StringCommand("mkdir", "-p", "--", quoted)
    yield StringCommand("chown", shlex.quote(f"{user}:{group}"), "--", quoted)
    yield StringCommand("chmod", shlex.quote(mode), "--", quoted)
    batch.forget(host)


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


class Content(bytes):
    """File content that never shows itself (pyinfra and drift print commands' arguments)."""

    def __repr__(self):
        return f"<{len(self)} bytes>"

    __str__ = __repr__


def put(
    state,
    host,
    dest: str,
    content: bytes,
    owner: str = "root",
    group: str = "root",
    mode: str = "644",
) -> bool:
    """Runs on the operator side at execution. The bytes travel by SFTP into a fresh 0700
    directory of the login user; root then writes them under umask 077 (0600 until the final
    chmod) next to dest and renames them into place. No predictable /tmp name that another
    local user could prepare, no content on a command line or in a log."""
    ok, output = host.run_shell_command("umask 077 && mktemp -d /tmp/servefleet-upload.XXXXXXXX")
    tmpdir = output.stdout.strip()
    if not ok or not tmpdir.startswith("/tmp/servefleet-upload."):
        return False
    staged = f"{tmpdir}/content"
    try:
        if not host.put_file(io.BytesIO(content), staged):
            return False
        part = f"{dest}.servefleet-new"
        q = {
            k: shlex.quote(v)
            for k, v in {
                "s": staged,
                "p": part,
                "d": dest,
                "o": f"{owner}:{group}",
                "m": mode,
            }.items()
        }
        parent = shlex.quote(dest.rsplit("/", 1)[0] or "/")
        script = (
            f"(umask 022 && mkdir -p {parent}) && umask 077 && cat {q['s']} > {q['p']} && chown {q['o']} {q['p']} && "
            f"chmod {q['m']} {q['p']} && mv -fT {q['p']} {q['d']}"
        )
        ok, output = host.run_shell_command(
            StringCommand("sh", "-c", shlex.quote(script)), **connector_args(host)
        )
        if not ok:
            host.log(f"upload to {dest} failed: {output.stderr.strip()[-300:]}")
        return ok
    finally:
        host.run_shell_command(StringCommand("rm", "-rf", shlex.quote(tmpdir)))


@operation()
def upload(
    dest: str,
    content,
    owner: str = "root",
    group: str = "root",
    mode: str = "644",
    secret: bool = False,
):
    """
    A file on the node with exactly this content, owner and mode; replaced atomically.

    + dest: the file on the node (its directory must exist)
    + content: the bytes (or text) it must hold, or a callable returning them (called when the
      operation runs: before execution for change detection, and again when it executes)
    + owner, group, mode: of the file
    + secret: never name the content; secret files are 0600-or-tighter from the first byte

    Used for everything root later runs or reads (scripts, units, patches, requests) and for
    secrets: see ``put`` for why not pyinfra's files.put through sudo. Change detection
    compares sha256 digests and the file's owner and mode.

    **Example:**

    .. code:: python

        node.upload(name="API key", dest="/opt/servefleet/etc/api-key", content=key + "\\n",
                    mode="600", secret=True)
    """
    if callable(content):
        content = content()
    data = Content(content.encode() if isinstance(content, str) else content)
    if secret and mode.lstrip("0") not in ("600", "400", "640", "440"):
        raise ValueError(f"secret {dest}: mode {mode} lets others read it")
    stat = batch.get(host, File, path=dest)
    same = bool(stat) and batch.get(host, Sha256File, path=dest) == hashlib.sha256(data).hexdigest()
    if (
        same
        and stat.get("user") == owner
        and stat.get("group") == group
        and str(stat.get("mode")) == mode.lstrip("0")
    ):
        host.noop(f"{dest} is in place ({owner}:{group} {mode})")
        return
    yield FunctionCommand(put, (dest, data, owner, group, mode), {})


@operation()
def absent(path: str):
    """
    No file at ``path`` (a secret that data no longer asks for, say).

    + path: the file

    **Example:**

    .. code:: python

        node.absent(name="No API key", path="/opt/servefleet/etc/api-key")
    """
    if batch.get(host, File, path=path) is None:
        host.noop(f"{path} is absent")
        return
    yield StringCommand("rm", "-f", shlex.quote(path))


def _others_may_write(mode) -> bool:
    """pyinfra's modes are octal digits as an int (755): is a group or other write bit set?"""
    digits = str(mode).zfill(3)
    return bool(int(digits[-2]) & 2 or int(digits[-1]) & 2)


@operation()
def root_owned(path: str):
    """
    Fail this host unless ``path`` exists, belongs to root and only root may write it: a file
    root starts (a unit's executable) must not be the service user's to change.

    + path: the file

    **Example:**

    .. code:: python

        node.root_owned(path="/var/cache/servefleet/standin/vllm-standin")
    """
    stat = batch.get(host, File, path=path)
    if not stat:
        yield fail_host(f"{path} does not exist on {host.name}")
    elif stat.get("user") != "root" or _others_may_write(stat.get("mode")):
        yield fail_host(
            f"{path} on {host.name} is {stat.get('user')}:{stat.get('group')} mode "
            f"{stat.get('mode')}: it must be root's and writable by root only"
        )
    else:
        host.noop(f"{path} is root's ({stat.get('mode')})")
