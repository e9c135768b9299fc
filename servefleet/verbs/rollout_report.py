"""What a rollout (or a rollback) reports, host by host, and how its hosts are batched:
--batch N or P%, --max-failures K, checked before any host is reached."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from servefleet.core.errors import DataError, Exit

ROLLBACK = "deploys/rollback.py"
UPGRADED, ROLLED_BACK, UNTOUCHED, ATTENTION = (
    "upgraded",
    "rolled back",
    "untouched",
    "needs attention",
)
# Healthy, on the release it served before: the data asked for nothing new (no change, no gate).
UNCHANGED = "unchanged"
# Healthy on the new release, but the performance gate could not tell whether it is slower:
# the host stays on it, and it counts neither as upgraded nor as failed.
INCONCLUSIVE = "inconclusive"


@dataclass
class HostRollout:
    name: str
    from_release: str | None = None
    to_release: str | None = None
    result: str = UNTOUCHED
    converge_s: float | None = None
    gate_s: float | None = None
    rollback_s: float | None = None
    detail: str = ""
    perf_s: float | None = None  # what the performance gate cost: baseline + check(s)
    perf: str = ""  # the performance gate's verdict, with both figures, or why it is off
    perf_before: dict | None = None  # the baseline (core.perf.Figures as JSON)
    perf_after: dict | None = None  # the figures measured on the new release
    again: bool = False  # the gate failed it, the node was found slower too: upgraded again


@dataclass
class RolloutReport:
    rollout_id: str
    hosts: dict[str, HostRollout] = field(default_factory=dict)
    message: str = ""
    refused: int | None = None  # the exit code when the rollout refused to start
    wanted: str = UPGRADED  # what a host that went well is: rolled back, for `rollback`

    @property
    def exit_code(self) -> int:
        if self.refused is not None:
            return self.refused
        results = {h.result for h in self.hosts.values()}
        if ATTENTION in results:
            return Exit.NEEDS_ATTENTION
        return Exit.OK if results <= {self.wanted, UNCHANGED} and self.hosts else Exit.DIFFERS

    def to_dict(self) -> dict:
        return {
            "rollout_id": self.rollout_id,
            "message": self.message,
            "hosts": {n: asdict(h) for n, h in self.hosts.items()},
            "exit_code": int(self.exit_code),
        }


BATCH = re.compile(r"([1-9][0-9]{0,5})(%?)")  # 2 or 25%: whole numbers, nothing else
MAX_FAILURES = 100_000


def batch_size(batch: str) -> tuple[int, bool]:
    """--batch N (hosts, 1..999999) or P% (of the hosts, 1..100) -> (N or P, is a percentage)."""
    m = BATCH.fullmatch(str(batch).strip())
    if not m or (m[2] and int(m[1]) > 100):
        raise DataError(
            f"--batch {str(batch)[:40]!r}: expected a number of hosts (2) or a "
            f"percentage of them from 1% to 100% (25%)"
        )
    return int(m[1]), bool(m[2])


def max_failures_of(value) -> int:
    """--max-failures K: the failed hosts tolerated, 0..MAX_FAILURES."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FAILURES:
        raise DataError(
            f"--max-failures {value!r}: expected a number of hosts from 0 to {MAX_FAILURES}"
        )
    return value


def batches(names: list[str], batch: str) -> list[list[str]]:
    """--batch N or P% (of the hosts, rounded up, at least one) -> the batches in order."""
    n, percent = batch_size(batch)
    size = max(math.ceil(len(names) * n / 100), 1) if percent else n
    return [names[i : i + size] for i in range(0, len(names), size)]
