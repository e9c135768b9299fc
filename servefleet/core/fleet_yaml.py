"""fleet.yml read strictly: a regular file of at most 1 MiB, UTF-8, YAML with no duplicate or
non-string keys, bounded nesting and alias expansion. core/inventory.py reads the entries."""

from __future__ import annotations

import reprlib
from pathlib import Path

import yaml

from servefleet.core.errors import DataError
from servefleet.core.operator_files import FileRefused, read_regular

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


def show(value) -> str:
    """A value from fleet.yml for an error message: repr, bounded (never a huge one)."""
    return _short.repr(value)


class FleetError(DataError):
    """fleet.yml is malformed; the message names the file, the entry and the problem."""


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
                None, None, f"duplicate key {show(key)}", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


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


def read_yaml(path: Path):
    """fleet.yml's document: regular, bounded, UTF-8, strict YAML (FleetError otherwise)."""
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
