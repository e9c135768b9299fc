"""Per-node status (`servefleet status`): what runs where, read with the recipes' own facts."""

from dataclasses import asdict, dataclass

from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from servefleet import facts, fleetapi
from servefleet.inventory import ROLES



@dataclass
class NodeStatus:
    host: str
    role: str | None = None
    engine: str | None = None  # "vLLM 0.24.0 (torch 2.11.0)", "llama.cpp <tag> (<commit>)"
    model: str | None = None  # repo id
    revision: str | None = None  # requested revision -> resolved sha
    service: str | None = None  # unit: active/enabled
    health: str | None = None  # HTTP status of /health on the node, or "down"
    port: int | None = None
    memory_used_gib: float | None = None
    memory_total_gib: float | None = None
    vram_used_gib: float | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _role(host) -> str | None:
    return next((r for r in ROLES if r in host.groups), None)


def _engine_and_model(host, role):
    """(engine text, model dir, unit) from the recipe's own facts and paths."""
    data = host.data.dict()
    if role == "spark":
        from servefleet import vllm
        from servefleet.facts_vllm import DistVersions

        found = host.get_fact(DistVersions, venv=vllm.venv_path(data), names=("torch", "vllm"))
        engine = (f"vLLM {found['vllm']} (torch {found.get('torch', '?')})" if "vllm" in found
                  else "vLLM: not installed")
        return engine, vllm.model_dir(data), vllm.UNIT
    if role == "rtx4090":
        from servefleet import llamacpp
        from servefleet.operations.llamacpp import LlamaBuilds

        builds = host.get_fact(LlamaBuilds, root=data["servefleet_root"])
        rec = builds.records.get(builds.current_name or "", {})
        engine = (f"llama.cpp {rec.get('tag')} ({str(rec.get('commit'))[:9]})" if rec
                  else "llama.cpp: not built")
        return engine, llamacpp.model_dir(data), llamacpp.UNIT
    return None, None, None


def node_status(host) -> NodeStatus:
    from servefleet.models import VerifiedModel

    data = host.data
    st = NodeStatus(host.name, role=_role(host))
    engine, model_dir, unit = _engine_and_model(host, st.role)
    st.engine = engine
    if model_dir:
        record = host.get_fact(VerifiedModel, path=model_dir)
        if record:
            st.model = record.get("repo_id")
            st.revision = f"{record.get('revision')} -> {str(record.get('sha'))[:12]}"
        else:
            st.model = "not verified"
    if unit:
        active = host.get_fact(SystemdStatus).get(unit)
        enabled = host.get_fact(SystemdEnabled).get(unit)
        st.service = (f"{'active' if active else 'inactive'}, "
                      f"{'enabled' if enabled else 'disabled'}")
        st.port = data.service_port
        address = "127.0.0.1" if data.service_host in ("0.0.0.0", "::") else data.service_host
        ok, out, _ = fleetapi.run(
            host, f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' http://{address}:"
                  f"{data.service_port}/health || true")
        st.health = out.strip() if out.strip() not in ("", "000") else "down"
    mem = host.get_fact(facts.MemoryBytes)
    st.memory_total_gib = round(mem["total"] / 1024**3, 1)
    st.memory_used_gib = round((mem["total"] - mem["available"]) / 1024**3, 1)
    ok, out, _ = fleetapi.run(host, "nvidia-smi --query-gpu=memory.used --format=csv,noheader,"
                                    "nounits 2>/dev/null || true")
    used = [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()]
    st.vram_used_gib = round(sum(used) / 1024, 1) if used else None
    return st


def status(inventory: str, limit=None) -> list[NodeStatus]:
    with fleetapi.session(inventory, limit) as sess:
        results = sess.each(node_status)
        out = [NodeStatus(n, error=why) for n, why in sess.unreachable.items()]
        for name, res in results.items():
            out.append(res if isinstance(res, NodeStatus)
                       else NodeStatus(name, error=f"{type(res).__name__}: {res}"))
    return sorted(out, key=lambda s: s.host)
