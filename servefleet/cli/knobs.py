"""`servefleet knobs [--markdown]`: every knob of the data contract, its default and its doc,
from group_data/*.py (the defaults and docs) and servefleet.core.contract (checks, recipes).
README's knob tables are this command's --markdown output."""

from __future__ import annotations

from pathlib import Path

from servefleet.cli.output import table
from servefleet.core import contract, groupdata
from servefleet.core.errors import InputError

SECTIONS = (
    ("all", "Shared by every host (group_data/all.py)"),
    ("spark", "DGX Spark, BF16 vLLM (group_data/spark.py)"),
    ("rtx4090", "RTX 4090, llama.cpp (group_data/rtx4090.py)"),
    ("depot", "Model depot (group_data/depot.py)"),
    ("testbed_spark", "Testbed only (group_data/testbed_spark.py)"),
)


def register(sub) -> None:
    p = sub.add_parser("knobs", help="every data key: default, doc, recipes (from group_data/)")
    p.add_argument("--markdown", action="store_true", help="README's tables")
    p.set_defaults(func=run)


def rows(group: str) -> list[tuple[str, str, str, str]]:
    out = []
    for a in groupdata.assignments(group):
        knob = contract.BY_NAME.get(a.name)
        recipes = ", ".join(knob.recipes) if knob else "?"
        flag = " (serving)" if knob and knob.serving else ""
        out.append((a.name, a.source, recipes + flag, a.doc))
    return out


def markdown() -> str:
    parts = []
    for group, title in SECTIONS:
        if not groupdata.group_file(group).is_file():
            continue
        parts.append(f"#### {title}\n\n| key | default | read by | meaning |\n|---|---|---|---|")
        for name, default, recipes, doc in rows(group):
            cell = default.replace("|", "\\|")
            parts.append(f"| `{name}` | `{cell}` | {recipes} | {doc.replace('|', '/')} |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def run(args) -> int:
    # The data pyinfra reads is the one under the current directory (the operator's repository),
    # not the installed package's copy: knobs reads the same, or says where to run it.
    if not groupdata.group_file("all").is_file():
        raise InputError(f"no {groupdata.group_file('all')} in {Path.cwd()}: run from the "
                         f"repository root (where group_data/ and inventory/ are)")
    if args.markdown:
        print(markdown(), end="")
        return 0
    for group, title in SECTIONS:
        if groupdata.group_file(group).is_file():
            print(f"{title}:")
            print(table(("key", "default", "meaning"), [(n, d, doc) for n, d, _, doc in rows(group)],
                        shrink=("default", "meaning")))
            print()
    return 0
