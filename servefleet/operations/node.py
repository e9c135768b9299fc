"""Operations every node gets from deploys/base.py: preflight, OS packages, the tree, tools."""

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt

from servefleet import facts
from servefleet.preflight import node_problems


def fail_host(message: str):
    """A command that fails this host only, with the message on stderr (other hosts go on).

    Raising instead would abort the whole run while pyinfra prepares operations.
    """
    return StringCommand(f"echo {shlex.quote('servefleet: ' + message)} >&2; exit 1")


@operation()
def preflight(data: dict):
    """
    Check that the node can run its recipe: CPU architecture, NVIDIA GPU and driver, free disk.

    + data: the recipe values to check against (``host.data`` as a dict)

    A failed check fails this host with every problem named; it changes nothing.

    **Example:**

    .. code:: python

        node.preflight(data=host.data.dict())
    """
    problems = node_problems(
        arch=host.get_fact(facts.CpuArch),
        gpus=host.get_fact(facts.NvidiaGpus),
        free_disk=host.get_fact(facts.FreeDiskBytes, path=data["servefleet_root"]),
        data=data,
    )
    if problems:
        yield fail_host(f"preflight failed on {host.name}: " + "; ".join(problems))
    else:
        host.noop(f"preflight passed on {host.name}")


@operation()
def os_packages(packages: list[str]):
    """
    Install apt packages, refreshing the package lists only when something is missing.

    + packages: Debian/Ubuntu package names

    ``apt.packages(update=True)`` would refresh the lists on every run and count as a change.

    **Example:**

    .. code:: python

        node.os_packages(packages=["git", "rsync"])
    """
    installed = host.get_fact(DebPackages)
    missing = [p for p in packages if p not in installed]
    if not missing:
        host.noop(f"OS packages present: {', '.join(packages)}")
        return
    yield from apt.update._inner()
    # Wait for a dpkg lock held by e.g. unattended-upgrades at boot instead of failing.
    yield from apt.packages._inner(packages=missing, no_recommends=True,
                                   extra_install_args="-o DPkg::Lock::Timeout=300")


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
