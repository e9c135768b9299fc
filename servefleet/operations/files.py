"""Operations that put files and directories on a node: owned directories and files, uploads
(atomic, never through a predictable /tmp name, secrets never shown), absent files, root-owned
checks.
"""

from __future__ import annotations

import hashlib
import io
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.facts.files import File, Sha256File

from servefleet.facts import batch
from servefleet.facts.node import PathStat
from servefleet.operations.node import connector_args, fail_host


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
    if (
        stat
        and batch.get(host, Sha256File, path=dest) == hashlib.sha256(data).hexdigest()
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
