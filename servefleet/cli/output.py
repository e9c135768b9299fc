"""Tables that read on an 80-column terminal: one line per row, values cut with '…' to fit.

Verbs print their default view with `table()`; the detail goes behind --wide and --json.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Sequence

from servefleet.core.node_output import shown

ELLIPSIS = "…"


def width() -> int:
    """The terminal's width: $COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        return shutil.get_terminal_size((80, 24)).columns


def cut(text: str, size: int) -> str:
    text = shown(str(text))  # a node's or a hub's words: no terminal escape gets through
    if len(text) <= size:
        return text
    return text[: max(size - 1, 0)] + ELLIPSIS if size > 0 else ""


def wrap(text: str, size: int, indent: str = "", more: str = "  ") -> list[str]:
    """Text that must be read whole (an error, a reason) as lines of at most `size` columns,
    the first indented by `indent`, the others by `more`; a word longer than a line (a path)
    is kept whole on its own line rather than broken."""
    # escaped but for NUL: knobs' placeholder for a space inside a code span (a terminal shows
    # nothing for a NUL)
    return textwrap.wrap(
        "\x00".join(shown(part) for part in str(text).split("\x00")),
        max(size, 20),
        initial_indent=indent,
        subsequent_indent=more,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence],
    max_width: int | None = None,
    shrink: Sequence[str] = (),
) -> str:
    """Columns separated by two spaces; when the lines are wider than max_width, the columns
    named in `shrink` (or the widest ones) are cut, widest first, until every line fits."""
    limit = max_width or width()
    cells = [[str(h) for h in headers]] + [
        ["-" if v is None else shown(str(v)) for v in r] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    flexible = [i for i, h in enumerate(headers) if h in shrink] or list(range(len(headers)))
    floor = {i: max(len(headers[i]), 4) for i in range(len(headers))}
    while sum(widths) + 2 * (len(widths) - 1) > limit:
        candidates = [i for i in flexible if widths[i] > floor[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    lines = []
    for row in cells:
        line = "  ".join(cut(v, w).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip()
        lines.append(cut(line, limit))
    return "\n".join(lines)
