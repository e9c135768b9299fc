"""What a converge is doing while it runs: pyinfra's callbacks, told as one line per operation
("operation 14 of 41: Build llama.cpp") to whoever shows the progress (a status line, cli/)."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra.api.state import BaseStateCallback


class OperationProgress(BaseStateCallback):
    """Calls `tell` as each operation of the deploy starts (on the hosts that run it)."""

    def __init__(self, tell: Callable[[str], None]) -> None:
        self.tell = tell
        self.done = 0

    def operation_start(self, state, op_hash):  # type: ignore[override]
        self.done += 1
        names = state.op_meta[op_hash].names
        name = " / ".join(sorted(names)) if names else "?"
        # "deploy | step | operation": the operation's own name says what it is.
        short = name.rsplit(" | ", 1)[-1]
        total = len(state.get_op_order())
        self.tell(f"operation {self.done} of {total}: {short}")
