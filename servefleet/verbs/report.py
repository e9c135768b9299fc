"""What `servefleet report` shows, read from the nodes in one session: each node's status (as
`servefleet status` reads it, verbs/status.py), its release history with the bench figures
kept on each release (state/releases.json, core.releases.Release.perf) and what the last
rollout did there (state/last-rollout.json, core.rollout_record)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from servefleet.core import perf
from servefleet.core.layout import NodeLayout
from servefleet.core.records import Unreadable
from servefleet.core.releases import Release, Releases
from servefleet.core.rollout_record import LastRollout
from servefleet.facts.releases import LastRolloutFact, NodeReleases
from servefleet.fleet import registry
from servefleet.verbs import session as api
from servefleet.verbs.status import NodeStatus, node_status

CURRENT, PREVIOUS, ROLLED_BACK_FROM = "current", "previous", "rolled back from"


@dataclass(frozen=True)
class ReleasePoint:
    """One kept release of a node, with the last figures measured on it (None: never)."""

    name: str  # "llama.cpp b9785"
    version: str  # "b9785"
    id: str
    state: str  # current | previous | rolled back from
    recorded_at: str
    figures: perf.Figures | None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "id": self.id,
            "state": self.state,
            "recorded_at": self.recorded_at,
            "figures": self.figures.to_json() if self.figures else None,
        }


@dataclass
class NodeReport:
    status: NodeStatus
    history: list[ReleasePoint] = field(default_factory=list)  # oldest first
    history_error: str | None = None  # releases.json is there but cannot be read
    last_rollout: LastRollout | None = None
    last_rollout_error: str | None = None

    @property
    def host(self) -> str:
        return self.status.host

    def to_dict(self) -> dict:
        return {
            **self.status.to_dict(),
            "history": [p.to_dict() for p in self.history],
            "history_error": self.history_error,
            "last_rollout": (
                None
                if self.last_rollout is None
                else {
                    **asdict(self.last_rollout),
                    "batch_hosts": list(self.last_rollout.batch_hosts),
                }
            ),
            "last_rollout_error": self.last_rollout_error,
        }


def history(records: Releases) -> list[ReleasePoint]:
    """The kept releases, oldest first (by when each was recorded; the current one last among
    equals), each with its figures."""
    kept: list[tuple[Release, str]] = [(r, PREVIOUS) for r in reversed(records.previous)]
    if records.rolled_back_from:
        kept.append((records.rolled_back_from, ROLLED_BACK_FROM))
    if records.current:
        kept.append((records.current, CURRENT))
    order = {id(r): i for i, (r, _) in enumerate(kept)}
    kept.sort(key=lambda pair: (pair[0].recorded_at, order[id(pair[0])]))
    return [
        ReleasePoint(r.short, r.version, r.id, state, r.recorded_at, perf.Figures.from_json(r.perf))
        for r, state in kept
    ]


def node_report(host) -> NodeReport:
    out = NodeReport(node_status(host))
    if registry.engine_of(host.groups) is None:  # a depot: no release, no rollout
        return out
    lay = NodeLayout.of(host.data.dict())
    records = host.get_fact(NodeReleases, path=lay.releases_file)
    out.history, out.history_error = history(records), records.unreadable
    last = host.get_fact(LastRolloutFact, path=lay.last_rollout)
    if isinstance(last, Unreadable):
        out.last_rollout_error = str(last)
    else:
        out.last_rollout = last
    return out


def report(inventory: str, limit=None) -> list[NodeReport]:
    """Every selected node's report, by host name; a node not reached has its status's error."""
    with api.session(inventory, limit) as sess:
        results = sess.each(node_report)
        roles = {h.name: registry.role_name(h.groups) for h in sess.targets}
        out = [
            NodeReport(NodeStatus(n, role=roles.get(n), error=why, unreachable=True))
            for n, why in sess.unreachable.items()
        ]
        for name, res in results.items():
            out.append(
                res
                if isinstance(res, NodeReport)
                else NodeReport(
                    NodeStatus(name, role=roles.get(name), error=f"{type(res).__name__}: {res}")
                )
            )
    return sorted(out, key=lambda r: r.host)
