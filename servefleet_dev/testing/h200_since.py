"""What the units gained after the last H200 run, by exact line: the evidence there is today's
unit less these lines, and nothing else. Emptied when tests/device/gpunode.sh and
tests/device/gpu_sandbox.sh are run again (the plans are in their headers). A line goes here
only when a unit changes in a session with no device lent."""

from __future__ import annotations

# Empty: the GPU node and the vLLM sandbox were run again on 2026-12-06 (an H100 was lent that
# day) with #27's InaccessiblePaths= line in both units.
SINCE_THE_RUN: tuple[str, ...] = ()


def as_run_on_the_h200(rendered: str) -> str:
    """Today's rendered unit as it would have been at the H200 run: each line added since is
    removed, and each must be there exactly once (an allowance that is not used fails)."""
    lines = rendered.splitlines(keepends=True)
    for added in SINCE_THE_RUN:
        found = [ln for ln in lines if ln.rstrip("\n") == added]
        assert len(found) == 1, f"{added!r} is not in today's unit once: empty SINCE_THE_RUN"
    return "".join(ln for ln in lines if ln.rstrip("\n") not in SINCE_THE_RUN)
