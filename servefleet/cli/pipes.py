"""Output into a pipe whose reader has gone (`servefleet knobs | head -1`): no traceback.

A Unix filter whose reader exits is killed by SIGPIPE, and the shell reports 141 (128 + 13).
Python ignores SIGPIPE (it must: an SSH connection whose peer went away would kill the whole
process), so a write raises BrokenPipeError instead. servefleet keeps that: the streams are
guarded, a write into a closed pipe is dropped and every later one goes to /dev/null, the command
finishes what it is doing (a rollout or a rebuild is never abandoned half-way because nobody
reads its report any more), and it exits 141, as a filter killed by SIGPIPE does, so a script
with `set -o pipefail` sees that the output was lost.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGPIPE_EXIT = 128 + int(signal.SIGPIPE)  # 141: what a shell reports for `yes | head -1`'s yes


class Guarded:
    """A text stream whose writes and flushes never raise BrokenPipeError: the first one sends
    the stream's file descriptor to /dev/null and marks it broken."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        self.broken = True
        try:  # what the buffer still holds, and every later write, goes nowhere
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError):  # not a real file (a test's capture): nothing to redirect
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def guarded() -> Iterator[list[Guarded]]:
    """sys.stdout and sys.stderr guarded while the command runs; both flushed at the end, so a
    reader that left before the last buffered line is noticed too."""
    saved = sys.stdout, sys.stderr
    streams = [Guarded(sys.stdout), Guarded(sys.stderr)]
    sys.stdout, sys.stderr = streams  # type: ignore[assignment]
    try:
        yield streams
    finally:
        for stream in streams:
            stream.flush()
        sys.stdout, sys.stderr = saved


def broken(streams: list[Guarded]) -> bool:
    return any(s.broken for s in streams)
