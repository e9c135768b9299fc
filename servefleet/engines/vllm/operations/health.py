"""What vLLM adds to the health check (servefleet.operations.health): the engine's KV-cache
log lines of this start against plan-kv's numbers, read from the node's config.json when the
check runs."""

from __future__ import annotations

from collections.abc import Mapping

from servefleet.engines.vllm.logic import kv_compared, kv_expectation
from servefleet.engines.vllm.operations.preflight import read_json_on_node


def health_args(gate: Mapping, on_node: bool) -> list[str]:
    """The health script's KV arguments for a release's gate (recipes/serving.py gate_args:
    kv_config, kv_data, engine_version, kv_user); on_node: read config.json now (not while
    pyinfra only plans). Releases recorded before kv_user was kept read as the default user."""
    kv_config, kv_data = gate.get("kv_config"), gate.get("kv_data")
    version = gate.get("engine_version")
    if not kv_config or kv_data is None:
        return []
    if version and not kv_compared(version):
        return ["--kv-not-compared", f"plan-kv is not checked against vLLM {version} on a GPU"]
    user = gate.get("kv_user") or "servefleet"
    config = read_json_on_node(kv_config, user) if on_node else None
    expected = kv_expectation(config, kv_data) if isinstance(config, dict) else None
    if expected:
        return [
            "--expect-tokens",
            str(expected[0]),
            "--expect-concurrency",
            expected[1],
            "--max-model-len",
            str(kv_data["max_model_len"]),
        ]
    if kv_data.get("kv_cache_memory_bytes") is None:
        return ["--kv-not-compared", "vLLM sizes its pool from free memory"]
    return []
