"""`servefleet knobs [--markdown]`: every knob of the data contract, its default and its doc,
from group_data/*.py (the defaults and docs) and servefleet.fleet.contract (checks, recipes).
docs/knobs.md's knob lists are this command's --markdown output: one list item per knob, every
line at most 100 columns, a long dict or list default shown by its size and its file."""

from __future__ import annotations

import re
from pathlib import Path

from servefleet.cli.output import table, width, wrap
from servefleet.core import groupdata
from servefleet.core.errors import InputError
from servefleet.engines import ENGINES
from servefleet.fleet import contract
from servefleet.fleet.nodes import NODE_CLASSES

MAX_COLUMNS = 100  # docs/ pages' limit (tests/unit/test_docs.py)
MAX_DEFAULT = 60  # a longer dict or list default is shown by its size and where it is written
CODE_SPAN = re.compile(r"`[^`]*`")
BLOCK = re.compile(r"([-+*>]|#+|\d+[.)])( |$)")
KEEP = "\x00"  # a space inside a code span while wrapping: a span is never cut across lines


def register(sub) -> None:
    p = sub.add_parser("knobs", help="every data key: default, doc, recipes (from group_data/)")
    p.add_argument("--markdown", action="store_true", help="docs/knobs.md's lists")
    p.add_argument(
        "--wide", action="store_true", help="each knob's default and recipes too, on one line"
    )
    p.set_defaults(func=run)


def sections() -> list[tuple[str, str]]:
    """(group, title) of each data file with defaults: all.py, each node class's, each engine's,
    then the testbed files that declare testbed-only knobs."""
    found = [("all", "Shared by every host")]
    found += [(n.name, f"Node class {n.title}") for n in NODE_CLASSES]
    found += [(e.name, f"Engine {e.title}") for e in ENGINES]
    testbed = sorted(p.stem for p in Path(groupdata.GROUP_DATA).glob("testbed*.py"))
    found += [
        (g, "Testbed only")
        for g in testbed
        if any(
            (k := contract.BY_NAME.get(a.name)) and k.scope == contract.TESTBED
            for a in groupdata.assignments(g)
        )
    ]
    return [
        (g, f"{title} (group_data/{g}.py)")
        for g, title in found
        if groupdata.group_file(g).is_file()
    ]


def narrow(knob_rows: list[tuple[str, str, str, str]], columns: int) -> list[str]:
    """Each knob's key and its meaning, the meaning wrapped (never cut) beside the key; the
    default and the recipes are --wide's."""
    keys = max((len(key) for key, *_ in knob_rows), default=3)
    lines = [f"{'key'.ljust(keys)}  meaning"]
    for key, _, _, doc in knob_rows:
        text = wrap(doc or "-", columns - keys - 2, more="")
        lines.append(f"{key.ljust(keys)}  {text[0]}".rstrip())
        lines += [f"{'':{keys}}  {line}" for line in text[1:]]
    return lines


def rows(group: str) -> list[tuple[str, str, str, str]]:
    """(key, default as shown, what reads it, doc) for each value of group_data/<group>.py."""
    return [(name, default, recipes, doc) for name, default, _, recipes, doc in knobs(group)]


def knobs(group: str) -> list[tuple[str, str, bool, str, str]]:
    """(key, default as shown, whether that is the value itself, what reads it, doc)."""
    out = []
    values = groupdata.load_group(group) or {}
    for a in groupdata.assignments(group):
        knob = contract.BY_NAME.get(a.name)
        recipes = ", ".join(contract.readers(knob)) if knob else "?"
        flag = " (serving)" if knob and knob.serving else ""
        default, literal = shown(a, values.get(a.name))
        out.append((a.name, default, literal, recipes + flag, a.doc))
    return out


def shown(a: groupdata.Assignment, value) -> tuple[str, bool]:
    """The default, or for a long dict or list its size and the file that holds it (with the
    comments on its entries)."""
    if len(a.default) <= MAX_DEFAULT or not isinstance(value, (dict, list, tuple)):
        return a.default, True
    kind = "a dict of {} keys" if isinstance(value, dict) else "a list of {} items"
    names = ", ".join(str(k) for k in value) if isinstance(value, dict) else ""
    size = kind.format(len(value)) + (f" ({names})" if names and len(names) <= 30 else "")
    return f"{size} in group_data/{a.file}.py", False


def item(name: str, default: str, literal: bool, recipes: str, doc: str) -> list[str]:
    """One knob as a list item, wrapped at MAX_COLUMNS; a code span is never cut."""
    text = f"- `{name}` = {f'`{default}`' if literal else default}, read by {recipes}"
    text = " ".join((text + (f": {doc}" if doc else "")).split())
    text = CODE_SPAN.sub(lambda m: m.group(0).replace(" ", KEEP), text)
    while True:
        lines = wrap(text, MAX_COLUMNS, more="  ")
        # A line that went on must not open a list, a quote or a heading of its own: glue the
        # word that would open it to the word before.
        opener = next((line.split()[0] for line in lines[1:] if BLOCK.match(line.lstrip())), None)
        if opener is None:
            return [line.replace(KEEP, " ") for line in lines]
        text = re.sub(rf" (?={re.escape(opener)}( |$))", KEEP, text, count=1)


def markdown() -> str:
    parts = []
    for group, title in sections():
        if not groupdata.group_file(group).is_file():
            continue
        parts.append(f"#### {title}\n")
        for knob in knobs(group):
            parts.extend(item(*knob))
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def run(args) -> int:
    # The data pyinfra reads is the one under the current directory (the operator's repository),
    # not the installed package's copy: knobs reads the same, or says where to run it.
    if not groupdata.group_file("all").is_file():
        raise InputError(
            f"no {groupdata.group_file('all')} in {Path.cwd()}: run from the "
            f"repository root (where group_data/ and inventory/ are)"
        )
    if args.markdown:
        print(markdown(), end="")
        return 0
    for group, title in sections():
        if groupdata.group_file(group).is_file():
            print(f"{title}:")
            if args.wide:
                print(table(("key", "default", "read by", "meaning"), rows(group), 10**6))
            else:
                print("\n".join(narrow(rows(group), width())))
            print()
    return 0
