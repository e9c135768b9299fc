"""What the steps and the verbs read of a llama.cpp node with facts: the GGUF lint's flag the
unit renders with, status's engine line, and drift's deep items of the build `current` names
(its commit and CMake flags vs data). The generic items (unit diff, model, service, release)
are servefleet.verbs.deep_drift's."""

from __future__ import annotations

from collections.abc import Callable

from servefleet.core import drift_items as di
from servefleet.core.layout import NodeLayout
from servefleet.engines.llamacpp import logic
from servefleet.engines.llamacpp.facts import GgufLint, LlamaBuilds
from servefleet.facts import batch


def lint_args(data, model_dir: str) -> dict:
    """The GGUF lint's arguments: the tools venv's python, the uploaded script, the file."""
    lay = NodeLayout.of(data)
    return {
        "python": lay.tools_python,
        "script": lay.bin("servefleet-gguf-lint"),
        "path": logic.model_path(model_dir, data),
        "user": data["servefleet_user"],
    }


def override_kv(host, data, model_dir: str) -> Callable[[], str | None]:
    """() -> the lint's --override-kv value, read on the node when called (the template calls it
    while it renders: before execution for change detection, and at execution after the
    download)."""

    def read() -> str | None:
        lint = batch.get(host, GgufLint, **lint_args(data, model_dir))
        return lint.flag if lint.state == "ok" else None

    return read


def unit_context(host, data, model_dir: str) -> dict:
    return logic.unit_context(data, model_dir, override_kv(host, data, model_dir))


def status(host, data) -> tuple[str, str]:
    """(short, detail) of the build `current` names."""
    builds = host.get_fact(LlamaBuilds, llama_dir=NodeLayout.of(data).llama_dir)
    rec = builds.records.get(builds.current_name or "", {})
    if not rec:
        return "llama.cpp: none", "llama.cpp: not built"
    return (
        f"llama.cpp {rec.get('tag')}",
        f"llama.cpp {rec.get('tag')} ({str(rec.get('commit'))[:9]}, {rec.get('describe')})",
    )


def deep_items(host, data, model_dir: str) -> list[di.Item]:
    """The build `current` points at vs the pinned commit and the CMake flags of data."""
    lay = NodeLayout.of(data)
    return logic.build_items(data, batch.get(host, LlamaBuilds, llama_dir=lay.llama_dir))
