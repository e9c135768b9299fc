"""The operator's fleet file (inventory/fleet.yml) as pyinfra groups, validated at load.

inventory/*.py call `fleet_groups()`; it reads fleet.yml strictly, puts each host in its node
class's group and its engine's (a role is a class with an engine: `role: spark` serves with the
class's engine, `engine: llamacpp` names another; the depot is a class without one), and validates every host's whole data (group_data files, the host's `data:`, `--data`) against
the contract before pyinfra connects anywhere. A problem stops the run with one line naming
the file, the host, the key and the fix (exit 2 from the pyinfra CLI).
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click
import pyinfra
from pyinfra_cli.util import parse_cli_arg

from servefleet.core import groupdata, host_keys, project, validate as c
from servefleet.core.errors import DataError, Exit
from servefleet.core.fleet_yaml import FleetError, read_yaml, show as _show
from servefleet.engines import ENGINES
from servefleet.fleet.data import HostData, Layer, recipe_of, validate
from servefleet.fleet.nodes import NODE_CLASSES

# The roles fleet.yml names: the node classes (servefleet.fleet.nodes); `engine:` the engines.
ROLES = tuple(n.name for n in NODE_CLASSES)
ENGINE_NAMES = tuple(e.name for e in ENGINES)
# pyinfra's own SSH connector keys, as the operator writes them in fleet.yml.
SSH_KEYS = {
    "ssh_hostname": str,
    "ssh_user": str,
    "ssh_port": int,
    "ssh_key": str,
    "ssh_key_password": str,
    "ssh_known_hosts_file": str,
    "ssh_strict_host_key_checking": str,
    "ssh_paramiko_connect_kwargs": dict,
}
ENTRY_KEYS = {"name", "role", "engine", "sudo", "testbed", "data", *SSH_KEYS}
# `testbed: true` makes a host a testbed host: it joins the testbed's groups, as the testbed's own
# inventory puts its hosts (group_data/testbed_<class>.py, testbed_<engine>.py, testbed.py), and
# only then may its data set testbed-only knobs (fleet/data.py). `servefleet testbed fleet` writes it.
TESTBED = "testbed"
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# What each string connection key may hold: exact forms (a value starting with '-' would be read
# as an option by a command it reaches; DEL and bidi controls are never part of a name).
_ADDRESS = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")
SSH_FORMS = {
    "ssh_hostname": c.Check(
        "a host name or IP address (letters, digits, '.', '_', '-', not starting with '-')",
        lambda v: bool(_ADDRESS.fullmatch(v)) or (":" in v and c.IP.ok(v)),
    ),
    "ssh_user": c.pattern(
        "a user name (letters, digits, '.', '_', '-', not starting with '-')",
        r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}",
    ),
    "ssh_key": c.Check(
        "a file path without spaces or control characters, not starting with '-'",
        lambda v: c.safe_text(v) and not v.startswith("-"),
    ),
}
SSH_FORMS["ssh_known_hosts_file"] = SSH_FORMS["ssh_key"]


# --- the run this inventory is loaded for: --data and the deploy --------------------------------


@dataclass
class RunContext:
    override_data: dict = field(default_factory=dict)
    deploy: str | None = None


_RUN: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "servefleet_run", default=None
)


def set_run_context(override_data: dict | None, deploy: str | None):
    """API callers (servefleet's verbs) say what the pyinfra CLI says on its command line."""
    return _RUN.set(RunContext(dict(override_data or {}), deploy))


def reset_run_context(token) -> None:
    _RUN.reset(token)


def run_context() -> RunContext:
    ctx = _RUN.get()
    if ctx is not None:
        return ctx
    click_ctx = click.get_current_context(silent=True)
    if pyinfra.is_cli and click_ctx is not None:  # the pyinfra CLI: its --data and deploy files
        params = click_ctx.params
        data = {}
        for arg in params.get("data") or ():
            key, _, value = arg.partition("=")
            data[key] = parse_cli_arg(value)
        for key in ("ssh_user", "ssh_key", "ssh_port"):  # --user, --key, --port, as pyinfra
            if params.get(key):
                data[key] = params[key]
        deploys = [op for op in params.get("operations") or () if op.endswith(".py")]
        return RunContext(data, deploys[0] if deploys else None)
    return RunContext()


@dataclass
class FleetHost:
    name: str
    role: str  # its node class
    engine: str | None  # the engine it serves with (its class's unless fleet.yml names one)
    connection: dict  # pyinfra's ssh_* keys and _sudo
    data: dict  # the entry's `data:` overrides
    where: str  # "inventory/fleet.yml: hosts[0] (spark-01)"
    testbed: bool = False  # `testbed: true`: in the testbed's groups (testbed_groups_of)


def _fail(path, where, problem):
    raise FleetError(f"{path}: {where}: {problem}")


def _engine(path, where: str, role: str, entry: dict) -> str | None:
    """The entry's engine: `engine:` when it names one, else its class's own."""
    cls = next(n for n in NODE_CLASSES if n.name == role)
    if "engine" not in entry:
        return cls.engine
    engine = entry["engine"]
    if cls.engine is None:
        _fail(path, where, f"'engine' = {_show(engine)}: a {role} serves no engine; remove it")
    if engine not in ENGINE_NAMES:
        _fail(path, where, f"'engine' = {_show(engine)}: expected one of {', '.join(ENGINE_NAMES)}")
    return engine


def load_fleet(path: str | Path) -> list[FleetHost]:
    path = Path(path)
    raw = read_yaml(path)
    extra = (
        [k for k in raw if k != "hosts" and not (isinstance(k, str) and k.startswith("x-"))]
        if isinstance(raw, dict)
        else []
    )
    if not isinstance(raw, dict) or extra or not isinstance(raw.get("hosts"), list):
        _fail(
            path,
            "top level",
            "expected a mapping with a 'hosts' list (and x-* keys for "
            "anchors to merge, e.g. x-defaults: &d {ssh_user: ubuntu})",
        )
    hosts: list[FleetHost] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, entry in enumerate(raw["hosts"]):
        where = f"hosts[{i}]"
        if not isinstance(entry, dict):
            _fail(path, where, f"expected a mapping, got {type(entry).__name__}")
        name = entry.get("name")
        if not isinstance(name, str) or not HOST_NAME.fullmatch(name) or len(name) > 63:
            _fail(
                path,
                where,
                f"'name' = {_show(name)}: expected a host name (letters, digits, . _ -)",
            )
        where = f"hosts[{i}] ({name})"
        # DNS and SSH see Spark-01, spark-01 and spark-01. as one machine: one entry each.
        key = name.lower().rstrip(".")
        if key in seen:
            j, other = seen[key]
            _fail(
                path,
                where,
                "duplicate name"
                + (
                    f": the same host as hosts[{j}] ({other}), the names differ only in case "
                    f"or a trailing dot"
                    if other != name
                    else ""
                ),
            )
        seen[key] = (i, name)
        unknown = sorted((set(entry) - ENTRY_KEYS), key=repr)
        if unknown:
            _fail(path, where, f"unknown keys {unknown}; allowed: {sorted(ENTRY_KEYS)}")
        role = entry.get("role")
        if role not in ROLES:
            _fail(path, where, f"'role' = {_show(role)}: expected one of {', '.join(ROLES)}")
        engine = _engine(path, where, role, entry)
        connection = {}
        for key, typ in SSH_KEYS.items():
            if key in entry:
                value = entry[key]
                if not isinstance(value, typ) or isinstance(value, bool):
                    _fail(path, where, f"{key!r} = {_show(value)}: expected {typ.__name__}")
                if typ is str and not c.safe_text(value):
                    _fail(
                        path,
                        where,
                        f"{key!r} = {_show(value)}: expected a value without spaces or control "
                        f"characters",
                    )
                form = SSH_FORMS.get(key)
                if form is not None and not form.ok(value):
                    _fail(path, where, f"{key!r} = {_show(value)}: expected {form.expected}")
                connection[key] = value
        if "ssh_key" in connection:
            try:
                connection["ssh_key"] = str(Path(connection["ssh_key"]).expanduser())
            except RuntimeError:  # ~nosuchuser/key: no such user's home
                _fail(
                    path,
                    where,
                    f"'ssh_key' = {_show(connection['ssh_key'])}: ~user names no user here; "
                    f"expected a path to your SSH private key",
                )
        if "ssh_port" in connection and not 0 < connection["ssh_port"] < 65536:
            _fail(path, where, f"'ssh_port' = {connection['ssh_port']}: expected 1-65535")
        if "sudo" in entry:
            if not isinstance(entry["sudo"], bool):
                _fail(path, where, f"'sudo' = {_show(entry['sudo'])}: expected true or false")
            connection["_sudo"] = entry["sudo"]
        testbed = entry.get(TESTBED, False)
        if not isinstance(testbed, bool):
            _fail(path, where, f"'testbed' = {_show(testbed)}: expected true or false")
        overrides = {} if entry.get("data") is None else entry["data"]
        if not isinstance(overrides, dict):
            _fail(path, where, f"'data' is {type(overrides).__name__}: expected a mapping")
        for key in overrides:
            if not isinstance(key, str):
                _fail(
                    path,
                    where,
                    f"'data' key {_show(key)} is {type(key).__name__}: expected a string",
                )
        clash = sorted(k for k in overrides if k in SSH_KEYS or k.startswith("_"))
        if clash:
            _fail(path, where, f"'data' sets {clash}: put connection keys at the entry's top level")
        hosts.append(
            FleetHost(name, role, engine, connection, dict(overrides), f"{path}: {where}", testbed)
        )
    return hosts


def fleet_path() -> Path:
    """inventory/fleet.yml, or $SERVEFLEET_FLEET to point at another file."""
    return Path(os.environ.get("SERVEFLEET_FLEET") or Path("inventory") / "fleet.yml")


# --- groups and validation ----------------------------------------------------------------------


@dataclass
class InventoryHost:
    """One host as an inventory file defines it: its groups in pyinfra's order."""

    name: str
    groups: list[str]  # the inventory's groups holding it, in definition order (file group last)
    data: dict  # host data (connection keys + overrides)
    data_source: str  # where the host data was written


def validate_hosts(hosts: Sequence[InventoryHost], cwd: str | Path = ".") -> None:
    """Validate every host's whole data as pyinfra will merge it; DataError on the first bad host."""
    project.check_group_data(cwd)  # else every default would be named as missing
    ctx = run_context()
    recipe = recipe_of(ctx.deploy)
    cache: dict[str, dict | None] = {}

    def group(name):
        if name not in cache:
            cache[name] = groupdata.load_group(name, cwd)
        return cache[name]

    checked = []
    for h in hosts:
        layers = [Layer("--data", ctx.override_data), Layer(h.data_source, h.data)]
        for g in reversed(h.groups):  # later groups win in pyinfra: first here
            if group(g) is not None:
                layers.append(Layer(f"{groupdata.GROUP_DATA}/{g}.py", group(g)))
        if group("all") is not None:
            layers.append(Layer(f"{groupdata.GROUP_DATA}/all.py", group("all")))
        checked.append(HostData(h.name, h.groups, layers))
    for host in checked:  # every layer: fleet.yml, --data, group_data; and the ssh config
        host_keys.warn(host.name, host.merged(), host.source_of)
    for host in checked:
        validate(host, recipe)


def stop_on_bad_input(func):
    """Run func(); a DataError ends the pyinfra CLI with its one line and exit 2 (no traceback).
    In API mode the error goes to the caller (servefleet's verbs print it the same way)."""
    try:
        return func()
    except DataError as exc:
        if pyinfra.is_cli and _RUN.get() is None:
            click.echo(f"--> servefleet: {exc}", err=True)
            raise SystemExit(int(Exit.BAD_INPUT)) from None
        raise


def groups_of(role: str, engine: str | None, *more: str) -> list[str]:
    """A host's groups in pyinfra's order, later groups' data winning: its node class, its
    engine, then `more` (the testbed's, the inventory file's)."""
    return [role, *([engine] if engine else []), *(g for g in more if g not in (role, engine))]


def testbed_groups_of(role: str, engine: str | None) -> list[str]:
    """A testbed host's groups beyond its class's and engine's, in pyinfra's order:
    testbed_<class>, testbed_<engine>, then testbed (whose data wins over both)."""
    return [f"{TESTBED}_{role}", *([f"{TESTBED}_{engine}"] if engine else []), TESTBED]


# Every testbed group in pyinfra's order: after the classes' and engines' (group_lists's `after`).
TESTBED_GROUPS = [*(f"{TESTBED}_{n}" for n in (*ROLES, *ENGINE_NAMES)), TESTBED]


def fleet_groups(inventory_file: str) -> dict[str, list]:
    """pyinfra's groups of fleet.yml's hosts, validated: every node class's and engine's group
    (class before engine: an engine's data wins over its class's). inventory/<class>.py takes
    that class's hosts, any other inventory file (inventory/fleet.py) every host.

        globals().update(fleet_groups(__file__))          # inventory/spark.py
    """

    def build():
        project.check_cwd(inventory_file)  # fleet.yml and group_data/ are read from here
        file_group = Path(inventory_file).stem
        hosts = [
            h for h in load_fleet(fleet_path()) if file_group not in ROLES or h.role == file_group
        ]
        groups = [
            groups_of(h.role, h.engine, *(testbed_groups_of(h.role, h.engine) if h.testbed else ()))
            for h in hosts
        ]
        validate_hosts(
            [
                InventoryHost(
                    h.name,
                    [*gs, *([file_group] if file_group not in gs else [])],
                    {**h.connection, **h.data},
                    h.where,
                )
                for h, gs in zip(hosts, groups, strict=True)
            ]
        )
        entries = [(h.name, {**h.connection, **h.data}) for h in hosts]
        return group_lists(entries, groups, file_group, after=TESTBED_GROUPS)

    return stop_on_bad_input(build)


def group_lists(
    entries: list, groups: list[list[str]], keep: str = "", after: Sequence[str] = ()
) -> dict[str, list]:
    """{group: [(name, data)]} in the registry's order (classes, then engines, then `after`,
    then the rest as first seen): pyinfra layers group data in that order. Empty groups are left
    out but `keep` (the inventory file's own class, so that an empty one says it has no hosts)."""
    order = [*ROLES, *ENGINE_NAMES, *after]
    order += [g for gs in groups for g in gs if g not in order]
    found: dict[str, list] = {}
    for name in dict.fromkeys(order):
        members = [e for e, gs in zip(entries, groups, strict=True) if name in gs]
        if members or name == keep:
            found[name] = members
    return found
