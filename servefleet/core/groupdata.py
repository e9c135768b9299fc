"""group_data/*.py as pyinfra reads them, and the one-line docs beside each value.

group_data is the operator's source of defaults and docs: `name = value  # what it is`. The
knob tables in README are generated from it and from servefleet.core.contract.
"""

from __future__ import annotations

import ast
import io
import runpy
import tokenize
from dataclasses import dataclass
from pathlib import Path

GROUP_DATA = "group_data"
# The files that hold defaults of fleet knobs (testbed*.py only override them, or declare
# testbed-only knobs).
DEFAULT_FILES = ("all", "spark", "rtx4090", "depot")


def group_file(name: str, cwd: str | Path = ".") -> Path:
    return Path(cwd) / GROUP_DATA / f"{name}.py"


def load_group(name: str, cwd: str | Path = ".") -> dict | None:
    """The values of group_data/<name>.py (as pyinfra keeps them), None when there is no file."""
    path = group_file(name, cwd)
    if not path.is_file():
        return None
    values = runpy.run_path(str(path))
    imported = _imported_names(path)
    return {k: v for k, v in values.items() if not k.startswith("__") and k not in imported}


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@dataclass(frozen=True)
class Assignment:
    name: str
    file: str  # group name (all, spark, ...)
    source: str  # the value as written
    doc: str  # the comment on the assignment's first line


def assignments(name: str, cwd: str | Path = ".") -> list[Assignment]:
    """Top-level `key = value  # doc` assignments of group_data/<name>.py, in file order."""
    path = group_file(name, cwd)
    text = path.read_text()
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            source = ast.get_source_segment(text, node.value) or ""
            out.append(Assignment(node.targets[0].id, name, " ".join(source.split()),
                                  comments.get(node.lineno, "")))
    return out
