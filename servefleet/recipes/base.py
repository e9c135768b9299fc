"""The start of every recipe and the base of every node (deploys/base.py).

`begin(recipe)` is how every deploy starts: the host's data is validated against the contract
(the same check the inventory ran before connecting, repeated here for inventories that are not
servefleet's), and a host the deploy does not act on (a serving deploy on a host of another
engine, the depot's on a serving node) gets a visible no-op. `node_base()` is the base every
recipe includes: preflight, OS packages, the service account and the tree, the tools venv.
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host
from pyinfra.facts.files import File, Sha256File

from servefleet.core.layout import NodeLayout
from servefleet.core.node import per_family
from servefleet.core.python_env import UV_ENV, source_args
from servefleet.facts import batch
from servefleet.facts.node import (
    Account,
    CpuArch,
    FreeDiskBytes,
    InstalledDebs,
    NvidiaGpus,
    OsRelease,
    PathChain,
    PathStat,
)
from servefleet.facts.pyenv import DistVersions
from servefleet.fleet import registry
from servefleet.fleet.data import HostData, Layer, root_reads, settle, validate
from servefleet.operations import files, node, pyenv, root_paths
from servefleet.recipes.steps import deploy

# The tools venv's packages (dist-info names): uv makes the serving venvs; hf fetches models.
# An engine adds its own (llama.cpp: gguf, which reads GGUF headers for the lint).
TOOLS = {"uv": "uv_version"}
MODEL_TOOLS = {"huggingface-hub": "huggingface_hub_version"}


def data() -> dict:
    return host.data.dict()


def layout() -> NodeLayout:
    return NodeLayout.of(host.data)


def family() -> str:
    return batch.get(host, OsRelease)["family"]


def family_value(key: str):
    """A per-distro-family table's entry (os_packages, python_interpreter, ...) for this host."""
    return per_family(host.data, key, family(), host.name)


def python() -> str:
    return family_value("python_interpreter")


def begin(recipe: str, plan: Callable[[], None] | None = None) -> bool:
    """Validate this host's data for deploys/<recipe>.py; False (and a visible no-op) on a host
    it does not act on. plan: what the recipe's own steps read besides the base (an engine's
    steps pass theirs), planned with the base's as one read."""
    validate(HostData(host.name, list(host.groups), [Layer("this host's data", data())]), recipe)
    settle(host.data)  # 8GiB from --data or fleet.yml: read as bytes by every step
    if registry.applies(recipe, host.groups):
        plan_base()
        if plan is not None:
            plan()
        return True
    whose = registry.whose(recipe)
    node.skip(
        name=f"{recipe} acts on {whose} hosts only: nothing to do on {host.name}",
        reason=f"{host.name} is not a {whose} host",
    )
    return False


def upload_reads(*paths: str) -> list:
    """What files.upload reads of each destination (its stat and its digest)."""
    return [(fact, {"path": p}) for p in paths for fact in (File, Sha256File)]


def package_query(key: str = "os_packages") -> tuple[str, ...]:
    """Every package name of a per-family table: what the node's dpkg is asked about, the same
    whichever family the node turns out to be (so the question can be planned)."""
    return tuple(sorted({p for names in (host.data.get(key) or {}).values() for p in names}))


def plan_base() -> None:
    """Everything the base's steps read, planned as one read (servefleet.facts.batch): a no-op
    check of the base costs one command per node."""
    lay = layout()
    batch.plan(
        host,
        [
            (CpuArch, {}),
            (NvidiaGpus, {}),
            (FreeDiskBytes, {"path": host.data.servefleet_root}),
            (OsRelease, {}),
            (InstalledDebs, {"names": package_query()}),
            *[(Account, {"user": name, "group": name}) for _, name, _, _ in accounts()],
            *[(PathStat, {"path": p}) for p in (*lay.tree, lay.cache_dir, lay.models_dir)],
            (PathStat, {"path": f"{lay.tools_venv}/pyvenv.cfg"}),
            (PathStat, {"path": f"{lay.tools_venv}/.lock"}),  # uv's, once it installed a tool
            (DistVersions, {"venv": lay.tools_venv, "names": tuple(TOOLS)}),
            *[(PathChain, {"path": path}) for path in root_read_paths().values()],
            *[
                (fact, {"path": lay.own_marker(d)})
                for _, d in own_dirs()
                for fact in (PathChain, PathStat)
            ],
        ],
    )


NOLOGIN = "/usr/sbin/nologin"


def accounts() -> tuple[tuple[str, str, str, str], ...]:
    """(data key, account, home, shell) of each account this host's recipe makes its own: the
    service account, and on a depot the read-only depot account (a shell: sshd runs its forced
    command through it)."""
    lay = layout()
    found = [("servefleet_user", host.data.servefleet_user, lay.cache_dir, NOLOGIN)]
    if registry.keeps_store(host.groups) and host.data.get("depot_user"):
        found.append(("depot_user", host.data.depot_user, lay.depot_home, "/bin/sh"))
    return tuple(found)


def own_dirs() -> tuple[tuple[str, str], ...]:
    """(data key, directory) of what servefleet makes its own on this host (NodeLayout.own_dirs)."""
    return layout().own_dirs(depot=registry.keeps_store(host.groups))


def check_own_dirs() -> None:
    """Fail this host unless each of own_dirs() is absent or servefleet's, under directories only
    root writes (before anything is made there, and before rebuild deletes in it)."""
    lay, user = layout(), host.data.servefleet_user
    owners = {"servefleet_root": "root", "models_root": user, "depot_store": user}
    # Made before markers existed: the root held the tools venv; the others the service's own.
    earlier = {
        "servefleet_root": batch.get(host, PathStat, path=f"{lay.tools_venv}/pyvenv.cfg")
        is not None,
        "models_root": True,
        "depot_store": True,
    }
    root_paths.own_dirs(
        name="Check that servefleet's directories are its own, under root's",
        dirs=own_dirs(),
        owners=owners,
        earlier=earlier,
    )


def mark_own_dirs(keys: tuple[str, ...]) -> None:
    """Root's marker in each of own_dirs() named by keys (made just before)."""
    lay = layout()
    for key, d in own_dirs():
        if key in keys:
            files.owned_file(name=f"servefleet's mark in {d}", path=lay.own_marker(d))


def root_read_paths() -> dict[str, str]:
    """{data key: path} of what root installs from, runs or compiles with (core.data.
    root_reads): the caches, local wheel directories and interpreters data names. Every
    family's interpreter: one absent on this node is judged by the directories above it."""
    return dict(root_reads(data()))


@deploy("Node base")
def node_base():
    """Preflight, OS packages, the service account and the tree, the tools venv."""
    preflight()
    os_packages()
    account_and_tree()
    tools(TOOLS)


@deploy("Preflight")
def preflight():
    node.preflight(
        name="Check CPU, GPU/driver, free disk and accounts", data=data(), accounts=accounts()
    )
    check_own_dirs()
    # Before anything runs, installs or builds: every recipe starts here (deploys/base.py too).
    paths = root_read_paths()
    if paths:
        root_paths.root_only(
            name="Check that only root can change the caches, wheel directories "
            "and interpreters root uses",
            paths=paths,
        )


@deploy("OS packages")
def os_packages(key: str = "os_packages"):
    node.os_packages(
        name=f"Install OS packages ({key})", packages=family_value(key), query=package_query(key)
    )


@deploy("Service account and tree")
def account_and_tree():
    """Root owns the tree and everything root runs; the service account owns only the
    directories the engine writes (its cache and the models)."""
    lay, user = layout(), host.data.servefleet_user
    node.account(name=f"System user {user}", user=user, home=lay.cache_dir, shell=NOLOGIN)
    for path in lay.tree:
        files.directory(name=f"Directory {path}", path=path, user="root", group="root", mode="755")
    # Models are read by the engine and, on a depot, by the read-only rsync account: 0755.
    files.directory(
        name=f"Directory {lay.cache_dir} (the service's)",
        path=lay.cache_dir,
        user=user,
        group=user,
        mode="750",
    )
    files.directory(
        name=f"Directory {lay.models_dir} (the service's)",
        path=lay.models_dir,
        user=user,
        group=user,
        mode="755",
    )
    mark_own_dirs(("servefleet_root", "models_root"))


@deploy("Tools venv")
def tools(packages: dict[str, str]):
    """servefleet's node-side tools in one root-owned venv: {distribution: version data key}.
    uv itself (TOOLS, the node base's) by the venv's pip; every later tool by that uv, a tenth
    of pip's CPU (pip's compiled sources kept: --compile-bytecode)."""
    lay = layout()
    pins = {name: host.data.get(key) for name, key in packages.items()}
    pyenv.venv(name=f"Tools venv {lay.tools_venv}", path=lay.tools_venv, python=python())
    uv = None if "uv" in pins else lay.tools_bin("uv")
    pyenv.packages(
        name="Tools: " + ", ".join(f"{n} {v}" for n, v in pins.items()),
        venv=lay.tools_venv,
        pins=pins,
        sources=source_args(host.data),
        uv=uv,
        env=UV_ENV if uv else None,
        compile_bytecode=True,
    )
    if uv:
        uv_lock_roots(lay.tools_venv)


def uv_lock_roots(venv: str):
    """uv leaves its install lock in a venv it installed into, writable by all: root runs that
    venv's programs, so nothing in it may be writable by anyone but root."""
    files.owned_file(
        name=f"{venv}/.lock: root's, 0644",
        path=f"{venv}/.lock",
        user="root",
        group="root",
        mode="644",
    )
