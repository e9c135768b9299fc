"""group_data/*.py as pyinfra reads them, and the one-line docs beside each value.

group_data is the operator's source of defaults and docs: `name = value  # what it is`. The
knob lists of docs/knobs.md are generated from it and from servefleet.fleet.contract.
"""

from __future__ import annotations

import ast
import io
import runpy
import tokenize
from dataclasses import dataclass
from pathlib import Path

GROUP_DATA = "group_data"


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
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@dataclass(frozen=True)
class Assignment:
    name: str
    file: str  # group name (all, spark, ...)
    source: str  # the value as written (comments included), on one line
    doc: str  # the comment on the assignment's first line
    default: str  # the value as shown: as written when on one line, else rendered (no comments)


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
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            source = ast.get_source_segment(text, node.value) or ""
            out.append(
                Assignment(
                    node.targets[0].id,
                    name,
                    " ".join(source.split()),
                    comments.get(node.lineno, ""),
                    _shown(node.value, source),
                )
            )
    return out


def _shown(node: ast.expr, source: str) -> str:
    """A default as the docs show it: the source when it is one line (`5 * 1024**3` reads
    better than its value), else the value itself, so that the comments between the lines of a
    long dict or list never end up in a default."""
    if "\n" not in source:
        return source
    try:
        return show(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, RecursionError):  # not a literal
        return ast.unparse(node)


def show(value) -> str:
    """A literal as written in group_data: double-quoted strings, no trailing commas."""
    if isinstance(value, str):
        return f'"{value}"' if '"' not in value and "\\" not in value else repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{show(k)}: {show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)
