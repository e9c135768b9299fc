"""Per-node status (`servefleet status`): what runs where, read with the recipes' own facts."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass

from servefleet.core.layout import NodeLayout, api_url
from servefleet.core.releases import what_differs
from servefleet.facts.models import VerifiedModel, record_args
from servefleet.facts.node import GpuMemoryUsed, MemoryBytes
from servefleet.facts.releases import NodeReleases
from servefleet.facts.systemd import UnitState
from servefleet.fleet import registry
from servefleet.operations.node import run
from servefleet.verbs import session as api


@dataclass
class NodeStatus:
    host: str
    role: str | None = None
    engine: str | None = None  # short, e.g. the engine and its version (Engine.status)
    engine_detail: str | None = None  # with what else identifies it (torch, commit)
    model: str | None = None  # repo id
    revision: str | None = None  # requested revision -> resolved sha
    service: str | None = None  # active | inactive | failed | ...
    enabled: bool | None = None
    health: str | None = None  # HTTP status of /health on the node, or "down"
    port: int | None = None
    memory_used_gib: float | None = None
    memory_total_gib: float | None = None
    vram_used_gib: float | None = None
    release: str | None = None  # current release, short
    previous_release: str | None = None
    rolled_back_from: str | None = None
    release_perf: dict | None = None  # bench figures its last gated rollout recorded (core.perf)
    previous_release_perf: dict | None = None
    error: str | None = None
    unreachable: bool = False  # not connected: error says why

    def to_dict(self) -> dict:
        return asdict(self)


def _role(host) -> str | None:
    return registry.role_name(host.groups)


def node_status(host) -> NodeStatus:
    data = host.data.dict()
    st = NodeStatus(host.name, role=_role(host))
    engine = registry.engine_of(host.groups)
    if engine is not None:
        st.engine, st.engine_detail = engine.status(host, data)
        unit = engine.unit
        state = host.get_fact(UnitState, unit=unit)
        st.service, st.enabled = state["active_state"] or "absent", state["enabled"]
        st.port = data["service_port"]
        ok, out, _ = run(
            host,
            f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' "
            f"{shlex.quote(api_url(data) + '/health')} || true",
        )
        st.health = out.strip() if out.strip() not in ("", "000") else "down"
        records = host.get_fact(NodeReleases, path=NodeLayout.of(data).releases_file)
        if records.unreadable:
            st.error = records.unreadable
        current = records.current
        if current:
            # What serves: the current release's model, checked against its verified record.
            verified = host.get_fact(VerifiedModel, **record_args(data, current.model_dir))
            st.model = current.model_repo if verified else f"{current.model_repo} (not verified)"
            st.revision = f"{current.model_revision} -> {str(current.model_sha)[:12]}"
        st.release = current.short if current else None
        prev = records.previous_release
        st.previous_release = (
            (what_differs(current, prev) if current else prev.short) if prev else None
        )
        st.release_perf, st.previous_release_perf = (
            current.perf if current else None,
            prev.perf if prev else None,
        )
        back = records.rolled_back_from
        st.rolled_back_from = (
            (what_differs(current, back) if current else back.short) if back else None
        )
    mem = host.get_fact(MemoryBytes)
    st.memory_total_gib = round(mem["total"] / 1024**3, 1)
    st.memory_used_gib = round((mem["total"] - mem["available"]) / 1024**3, 1)
    used = host.get_fact(GpuMemoryUsed)
    st.vram_used_gib = round(sum(used) / 1024, 1) if used else None
    return st


def status(inventory: str, limit=None) -> list[NodeStatus]:
    with api.session(inventory, limit) as sess:
        results = sess.each(node_status)
        roles = {h.name: _role(h) for h in sess.targets}
        out = [
            NodeStatus(n, role=roles.get(n), error=why, unreachable=True)
            for n, why in sess.unreachable.items()
        ]
        for name, res in results.items():
            out.append(
                res
                if isinstance(res, NodeStatus)
                else NodeStatus(name, role=roles.get(name), error=f"{type(res).__name__}: {res}")
            )
    return sorted(out, key=lambda s: s.host)
