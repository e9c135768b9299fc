"""Values written into systemd unit files, escaped so that data can never add a directive.

Data checks (servefleet.core.validate) already refuse newlines, control characters and
whitespace in every value that reaches a unit; escaping here is the second line: '%' is a
specifier, '$' expands variables in Exec lines, quotes and backslashes delimit words.
"""

from __future__ import annotations

import re

from pyinfra.api.util import get_template

_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnitValueError(ValueError):
    """A value that no escaping makes safe in a unit (a newline, a control character)."""


def _refuse_control(value: str) -> None:
    if _CONTROL.search(value):
        raise UnitValueError(f"{value!r} holds a control character or newline")


class Specifier(str):
    """A word written as is, for systemd's own specifiers (e.g. %d, the credentials directory)."""


def exec_word(value: str) -> str:
    """One word of an ExecStart= command line."""
    if isinstance(value, Specifier):
        return str(value)
    value = str(value)
    _refuse_control(value)
    escaped = value.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(value):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: list[str]) -> str:
    """argv as an ExecStart= value, one option per continued line."""
    words = [exec_word(a) for a in argv]
    lines, current = [], [words[0]]
    for word in words[1:]:
        if word.startswith("--"):
            lines.append(" ".join(current))
            current = [word]
        else:
            current.append(word)
    lines.append(" ".join(current))
    return " \\\n    ".join(lines)


def setting(value) -> str:
    """A plain setting value (User=, WorkingDirectory=, a path in ReadWritePaths=)."""
    value = str(value)
    _refuse_control(value)
    if not _PLAIN.fullmatch(value):
        raise UnitValueError(f"{value!r} is not a plain value (letters, digits, '_@+=:,./-')")
    return value.replace("%", "%%")


def text(value) -> str:
    """Free text of one line (Description=): '%' escaped, no control characters."""
    value = str(value)
    _refuse_control(value)
    return value.replace("%", "%%")


def environment(name: str, value) -> str:
    """An Environment= assignment, quoted as one word."""
    value = str(value)
    _refuse_control(value)
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
        raise UnitValueError(f"{name!r} is not an environment variable name")
    escaped = value.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'"{name}={escaped}"'


def render_unit(template: str, context: dict) -> str:
    """A unit template (files/...) rendered as it is installed, and as drift renders it to
    compare: pyinfra's jinja2 environment, templates resolved against the project."""
    return get_template(template).render(context)
