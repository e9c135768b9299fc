"""Long work says where it is: one status line (rich) with the phase, what it is doing now and
the time since the phase began, refreshed while it runs, e.g.

    ⠋ converging deploys/serve_q4_llamacpp.py: operation 14 of 41: Build llama.cpp (2m 05s)

A converge or a host build takes minutes and prints nothing until it ends. The line is drawn only
on a terminal (rich draws no live line into a file or a pipe), and not at all when the console
is quiet (--json)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text


def elapsed(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m {seconds:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


class Line:
    """The status line's text: the phase, a detail, the seconds since the phase began (read
    again each time rich redraws the line, so the clock runs while the work is silent)."""

    def __init__(self, phase: str) -> None:
        self.phase(phase)

    def phase(self, text: str) -> None:
        """A new phase: its text, no detail yet, the clock from zero."""
        self.text, self.what, self.started = text, "", time.monotonic()

    def detail(self, text: str) -> None:
        """What the phase is doing now (the operation that runs), the clock kept."""
        self.what = text

    def __str__(self) -> str:
        what = f": {self.what}" if self.what else ""
        return f"{self.text}{what} ({elapsed(time.monotonic() - self.started)})"

    def __rich__(self) -> Text:
        return Text(str(self), no_wrap=True, overflow="ellipsis")


@contextmanager
def status(console: Console, phase: str) -> Iterator[Line]:
    """The status line on `console` while the block runs; yields its Line to update."""
    line = Line(phase)
    if console.quiet:  # no live display at all: it would swallow what is printed meanwhile
        yield line
        return
    with console.status(line):
        yield line


def stderr_console(quiet: bool = False) -> Console:
    """A console on stderr for the status line, quiet under --json and when stderr is not a
    terminal (the report on stdout stays the only output)."""
    console = Console(stderr=True, highlight=False)
    console.quiet = quiet or not console.is_terminal
    return console
