"""The last rollout as each node keeps it: `{root}/state/last-rollout.json`, written by
`servefleet rollout` when it ends (verbs/rollout_record.py), read by `servefleet report`.

One record per node, about that node only: the rollout's id, when it ended, how many batches it
had and the exit code and message it ended with, then the node's own part: its batch (number
and hosts), the release it came from and went to, its result, the phases' seconds, the health
and performance gates' words and figures. The report puts the records of one rollout id back
together, batch by batch. A rollout refused before it touched any host writes none; an
interrupted one keeps its marker (state/rollout.json) instead, and its rerun writes the record.

Like every record in state/, it is parsed strictly (core.records): only root writes it, and
whatever it says is shown escaped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from servefleet.core import records as rc
from servefleet.core.records import RecordError

WHAT = "last-rollout.json"
MAX_HOSTS = 10_000  # hosts a batch may name
# The node's part (verbs/rollout_report.HostRollout as JSON): key -> allowed types.
HOST_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "from_release": (str, type(None)),
    "to_release": (str, type(None)),
    "result": str,
    "converge_s": (int, float, type(None)),
    "gate_s": (int, float, type(None)),
    "rollback_s": (int, float, type(None)),
    "detail": str,
    "perf_s": (int, float, type(None)),
    "perf": str,
    "perf_before": (dict, type(None)),
    "perf_after": (dict, type(None)),
    "again": bool,
}
TEXT_MAX = 16 * 1024  # a detail or a verdict: a few lines at most


@dataclass(frozen=True)
class LastRollout:
    rollout_id: str
    finished_at: str  # UTC, 2026-12-06T16:30:24Z
    batch: int  # this node's batch, from 1
    batches: int  # how many the rollout had
    batch_hosts: tuple[str, ...]  # the hosts of this node's batch, in order
    exit_code: int
    message: str = ""  # the rollout's own words (stopped after ...), or ""
    host: dict = field(default_factory=dict)  # the node's part (HOST_TYPES)

    def dumps(self) -> str:
        doc = asdict(self)
        doc["batch_hosts"] = list(self.batch_hosts)
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @property
    def result(self) -> str:
        return str(self.host.get("result", ""))

    @classmethod
    def loads(cls, text: str) -> LastRollout | None:
        """The record of last-rollout.json's text (None for an empty file); RecordError."""
        doc = rc.load(text, WHAT)
        if doc is None:
            return None
        rc.only_keys(doc, cls.__dataclass_fields__, WHAT)
        batch, batches, code = (_count(doc, k) for k in ("batch", "batches", "exit_code"))
        if not 1 <= batch <= batches:
            raise RecordError(f"{WHAT}: 'batch' is not between 1 and 'batches'")
        hosts = doc.get("batch_hosts")
        if not (
            isinstance(hosts, list)
            and len(hosts) <= MAX_HOSTS
            and all(isinstance(h, str) and 0 < len(h) <= 255 for h in hosts)
        ):
            raise RecordError(f"{WHAT}: 'batch_hosts' is not a list of host names")
        return cls(
            rollout_id=rc.text(doc, "rollout_id", WHAT, 128),
            finished_at=rc.text(doc, "finished_at", WHAT, 64),
            batch=batch,
            batches=batches,
            batch_hosts=tuple(hosts),
            exit_code=code,
            message=_long_text(doc.get("message", ""), "message"),
            host=_host(doc.get("host")),
        )


def _count(doc: dict, key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise RecordError(f"{WHAT}: {key!r} is not a whole number from 0 to 1000000")
    return value


def _long_text(value, key: str) -> str:
    """A message or a verdict: any text up to TEXT_MAX (shown escaped, never run)."""
    if not isinstance(value, str) or len(value) > TEXT_MAX:
        raise RecordError(f"{WHAT}: {key!r} is not a text of at most {TEXT_MAX} characters")
    return value


def _host(doc) -> dict:
    rc.only_keys(doc, HOST_TYPES, f"{WHAT}'s host")
    for key, value in doc.items():
        kinds = HOST_TYPES[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool):
            raise RecordError(f"{WHAT}'s host: {key!r} has the wrong type")
        if isinstance(value, str):
            _long_text(value, key)
    if not isinstance(doc.get("name"), str) or not isinstance(doc.get("result"), str):
        raise RecordError(f"{WHAT}'s host: 'name' and 'result' are required")
    return dict(doc)


def newest(found: dict[str, LastRollout]) -> str | None:
    """The id of the newest rollout among the nodes' records (ids begin with their start time,
    20261206T163024-...; the latest end breaks a tie), or None."""
    if not found:
        return None
    return max(found.values(), key=lambda r: (r.rollout_id[:15], r.finished_at)).rollout_id


@dataclass(frozen=True)
class RolloutView:
    """The newest rollout, put back together from the nodes' records: its batches in order,
    each with its hosts and their parts (None: no record of this rollout was read there)."""

    rollout_id: str
    finished_at: str
    exit_code: int
    message: str
    batches: tuple[tuple[int, tuple[tuple[str, dict | None], ...]], ...]
    count: int  # batches the rollout had
    older: tuple[tuple[str, LastRollout], ...] = ()  # hosts whose last rollout was another

    @classmethod
    def of(cls, found: dict[str, LastRollout]) -> RolloutView | None:
        latest = newest(found)
        if latest is None:
            return None
        mine = {n: r for n, r in found.items() if r.rollout_id == latest}
        first = max(mine.values(), key=lambda r: r.finished_at)
        members: dict[int, list[str]] = {}
        for rec in sorted(mine.values(), key=lambda r: r.batch):
            names = members.setdefault(rec.batch, [])
            names += [h for h in rec.batch_hosts if h not in names]
        return cls(
            latest,
            first.finished_at,
            first.exit_code,
            first.message,
            tuple(
                (n, tuple((h, mine[h].host if h in mine else None) for h in members[n]))
                for n in sorted(members)
            ),
            first.batches,
            tuple(sorted((n, r) for n, r in found.items() if r.rollout_id != latest)),
        )
