"""fleet.yml read strictly: a regular file of at most 1 MiB, UTF-8, YAML with no duplicate or
non-string keys, bounded nesting and alias expansion. core/inventory.py reads the entries."""

from __future__ import annotations

import re
import reprlib
import unicodedata
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


# What a fleet file never holds, with the line it is on: characters YAML 1.1 reads as a line break
# where an editor shows none (U+0085, U+2028, U+2029, a lone CR: a comment ends there, so a key
# after it is read), bidi controls that make text read other than it runs, and every other
# control character but tab and line end.
_UNSEEN = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
    r"\u2066-\u2069]|\r(?!\n)"
)


def _unseen_problem(text: str) -> str | None:
    found = _UNSEEN.search(text)
    if found is None:
        return None
    ch = found.group(0)
    line = text.count("\n", 0, found.start()) + 1
    if ch in "\x85\u2028\u2029\r":
        why = "YAML 1.1 ends a line there (and a comment with it), where an editor shows none"
    elif unicodedata.category(ch) == "Cf":
        why = "a bidi control, which makes the text read other than it runs"
    else:
        why = "a control character"
    return f"refused at line {line}: U+{ord(ch):04X} ({why}); expected plain text (remove it)"


# Only plain decimal numbers are numbers: YAML 1.1 reads 22:00 as 1320 (base 60), 010 as 8
# (octal), 0x16, 0b10 and 1_000 as ints, and .inf or 1:30.5 as floats.
_DECIMAL_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_DECIMAL_FLOAT = re.compile(r"-?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _strict_number(pattern, construct, kind):
    def constructor(loader, node):
        if not pattern.fullmatch(node.value):
            read = construct(loader, node)
            raise _Refused(
                None,
                None,
                f"{show(node.value)} is read by YAML 1.1 as the {kind} {show(read)}; expected a "
                f"plain decimal number (or quote it for a string)",
                node.start_mark,
            )
        return construct(loader, node)

    return constructor


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
_StrictLoader.add_constructor(
    "tag:yaml.org,2002:int",
    _strict_number(_DECIMAL_INT, yaml.SafeLoader.construct_yaml_int, "integer"),
)
_StrictLoader.add_constructor(
    "tag:yaml.org,2002:float",
    _strict_number(_DECIMAL_FLOAT, yaml.SafeLoader.construct_yaml_float, "number"),
)


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
    unseen = _unseen_problem(text)
    if unseen:
        raise FleetError(f"{path}: {unseen}")
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
