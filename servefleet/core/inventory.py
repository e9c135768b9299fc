"""The operator's fleet file (inventory/fleet.yml) as pyinfra groups, validated at load.

inventory/*.py call `fleet_groups()`; it reads fleet.yml strictly, builds one group per role,
and validates every host's whole data (group_data files, the host's `data:`, `--data`) against
the contract before pyinfra connects anywhere. A problem stops the run with one line naming
the file, the host, the key and the fix (exit 2 from the pyinfra CLI).
"""

from __future__ import annotations

import contextvars
import os
import re
import reprlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import click
import pyinfra
import yaml
from pyinfra_cli.util import parse_cli_arg

from servefleet.core import groupdata
from servefleet.core.data import HostData, Layer, recipe_of, validate
from servefleet.core.errors import DataError, Exit
from servefleet.core.operator_files import FileRefused, read_regular

ROLES = ("spark", "rtx4090", "depot")
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
ENTRY_KEYS = {"name", "role", "sudo", "data", *SSH_KEYS}
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A fleet file is one short entry per node: 1 MiB is thousands of nodes. Bigger is refused before
# it is read (PyYAML's pure-Python loader takes ~0.5 s per MB).
MAX_FLEET_BYTES = 1 << 20
# Nodes once aliases (*name) are expanded: bounds a YAML alias bomb (billion laughs), whose
# expansion would hang any code that walks or prints the value.
MAX_FLEET_NODES = 100_000
# Collections inside collections: a fleet file needs 5 (hosts, entry, data, a knob's table, its
# list); PyYAML composes recursively, so 5,000 nested `[` would end in a RecursionError.
MAX_FLEET_DEPTH = 32
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60
_short.maxlevel, _short.maxlist, _short.maxdict = 2, 4, 4


def _show(value) -> str:
    """A value from fleet.yml for an error message: repr, bounded (never a huge one)."""
    return _short.repr(value)


class FleetError(DataError):
    """fleet.yml is malformed; the message names the file, the entry and the problem."""


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
        deploys = [op for op in params.get("operations") or () if op.endswith(".py")]
        return RunContext(data, deploys[0] if deploys else None)
    return RunContext()


# --- fleet.yml ----------------------------------------------------------------------------------


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that no fleet file is (a key that is no string, nesting too deep)."""


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses duplicate keys (a second `role:` silently winning is a typo), keys that
    are not strings, and nesting deeper than MAX_FLEET_DEPTH."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_FLEET_DEPTH:
                raise _Refused(
                    None,
                    None,
                    f"nested more than {MAX_FLEET_DEPTH} levels deep",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _no_duplicates(loader, node, deep=False):
    """A mapping whose written keys are all different; merge keys (<<: *defaults) still work,
    and a written key overrides a merged one, as YAML says."""
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if key_node.tag != "tag:yaml.org,2002:str":  # every key servefleet reads is a string
            raise _Refused(
                None,
                None,
                f"a key of type {key_node.tag.rsplit(':', 1)[-1]}: expected a string key",
                key_node.start_mark,
            )
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {_show(key)}", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


@dataclass
class FleetHost:
    name: str
    role: str
    connection: dict  # pyinfra's ssh_* keys and _sudo
    data: dict  # the entry's `data:` overrides
    where: str  # "inventory/fleet.yml: hosts[0] (spark-01)"


def _fail(path, where, problem):
    raise FleetError(f"{path}: {where}: {problem}")


def _bounded(path: Path, node) -> None:
    """Refuse a document of more than MAX_FLEET_NODES nodes once aliases are expanded."""
    count, stack = 0, [node]
    while stack:
        n = stack.pop()
        count += 1
        if count > MAX_FLEET_NODES:
            raise FleetError(
                f"{path}: more than {MAX_FLEET_NODES} YAML nodes once aliases (*name) "
                f"are expanded (an alias bomb?)"
            )
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            for key, value in n.value:
                stack += (key, value)


def _read_yaml(path: Path):
    try:
        raw = read_regular(path, MAX_FLEET_BYTES)  # never a FIFO (hangs) or a device
    except FileNotFoundError:
        raise FleetError(
            f"{path}: not found (write one entry per node; see docs/nodes.md)"
        ) from None
    except OSError as exc:
        raise FleetError(f"{path}: cannot be read ({exc.strerror})") from None
    except FileRefused as exc:
        raise FleetError(f"{exc}: a fleet file holds one short entry per node") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FleetError(f"{path}: not UTF-8 (byte {exc.start}); save it as UTF-8") from None
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _bounded(path, node)
            doc = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        what = "refused" if isinstance(exc, _Refused) else "not valid YAML"
        raise FleetError(f"{path}: {what}{where}: {problem}") from None
    if doc is None:
        raise FleetError(
            f"{path}: empty; expected a mapping with a 'hosts' list (an empty fleet "
            f"is written hosts: [])"
        )
    return doc


def load_fleet(path: str | Path) -> list[FleetHost]:
    path = Path(path)
    raw = _read_yaml(path)
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
    hosts, seen = [], set()
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
        if name in seen:
            _fail(path, where, "duplicate name")
        seen.add(name)
        unknown = sorted((set(entry) - ENTRY_KEYS), key=repr)
        if unknown:
            _fail(path, where, f"unknown keys {unknown}; allowed: {sorted(ENTRY_KEYS)}")
        role = entry.get("role")
        if role not in ROLES:
            _fail(path, where, f"'role' = {_show(role)}: expected one of {', '.join(ROLES)}")
        connection = {}
        for key, typ in SSH_KEYS.items():
            if key in entry:
                value = entry[key]
                if not isinstance(value, typ) or isinstance(value, bool):
                    _fail(path, where, f"{key!r} = {_show(value)}: expected {typ.__name__}")
                if typ is str and (not value or any(ch.isspace() or ord(ch) < 32 for ch in value)):
                    _fail(path, where, f"{key!r} = {_show(value)}: expected a value without spaces")
                connection[key] = value
        if "ssh_key" in connection:
            connection["ssh_key"] = str(Path(connection["ssh_key"]).expanduser())
        if "ssh_port" in connection and not 0 < connection["ssh_port"] < 65536:
            _fail(path, where, f"'ssh_port' = {connection['ssh_port']}: expected 1-65535")
        if "sudo" in entry:
            if not isinstance(entry["sudo"], bool):
                _fail(path, where, f"'sudo' = {_show(entry['sudo'])}: expected true or false")
            connection["_sudo"] = entry["sudo"]
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
        hosts.append(FleetHost(name, role, connection, dict(overrides), f"{path}: {where}"))
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


_warned: set[str] = set()


def host_key_checking_off(data: dict) -> str | None:
    """How this host's data switches host-key checking off, or None: the explicit values, and a
    known_hosts file that keeps nothing (a device such as /dev/null, or an empty path)."""
    strict = data.get("ssh_strict_host_key_checking")
    if strict is not None and str(strict).strip().lower() in ("no", "off", "false", "0", ""):
        return f"ssh_strict_host_key_checking: {strict}"
    known = data.get("ssh_known_hosts_file")
    if known is not None:
        path = Path(str(known)).expanduser()
        if (
            str(known).strip() == ""
            or str(path).startswith(("/dev/", "/proc/"))
            or (path.exists() and not path.is_file())
        ):
            return f"ssh_known_hosts_file: {known} (keeps no key)"
    return None


def _warn_host_keys(hosts: Sequence[InventoryHost]) -> None:
    for h in hosts:
        how = host_key_checking_off(h.data)
        if how and h.name not in _warned:
            _warned.add(h.name)
            print(
                f"servefleet: WARNING: SSH host-key checking is OFF for {h.name} "
                f"({how}, {h.data_source}): anyone between you and it can impersonate the "
                f"node. Pin its key in ssh_known_hosts_file.",
                file=sys.stderr,
            )


def validate_hosts(hosts: Sequence[InventoryHost], cwd: str | Path = ".") -> None:
    """Validate every host's whole data as pyinfra will merge it; DataError on the first bad host."""
    ctx = run_context()
    recipe = recipe_of(ctx.deploy)
    cache: dict[str, dict | None] = {}

    def group(name):
        if name not in cache:
            cache[name] = groupdata.load_group(name, cwd)
        return cache[name]

    _warn_host_keys(hosts)
    for h in hosts:
        layers = [Layer("--data", ctx.override_data), Layer(h.data_source, h.data)]
        for g in reversed(h.groups):  # later groups win in pyinfra: first here
            if group(g) is not None:
                layers.append(Layer(f"{groupdata.GROUP_DATA}/{g}.py", group(g)))
        if group("all") is not None:
            layers.append(Layer(f"{groupdata.GROUP_DATA}/all.py", group("all")))
        validate(HostData(h.name, h.groups, layers), recipe)


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


def fleet_groups(inventory_file: str, roles: Sequence[str] = ROLES) -> list[list]:
    """The (name, data) lists of `roles` from fleet.yml, validated; one list per role.

    spark, = fleet_groups(__file__, ["spark"])          # inventory/spark.py
    """

    def build():
        file_group = Path(inventory_file).stem
        hosts = [h for h in load_fleet(fleet_path()) if h.role in roles]
        validate_hosts(
            [
                InventoryHost(
                    h.name,
                    [h.role] + ([file_group] if file_group != h.role else []),
                    {**h.connection, **h.data},
                    h.where,
                )
                for h in hosts
            ]
        )
        return [[(h.name, {**h.connection, **h.data}) for h in hosts if h.role == r] for r in roles]

    return stop_on_bad_input(build)
