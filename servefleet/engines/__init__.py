"""The engines servefleet serves with, listed once. Each is declared in its own package
(servefleet/engines/<name>/__init__.py, docs/engines.md); the data contract, the inventory, the
knob docs and the verbs iterate this list. Generic code imports this module, never an engine's
package (the import-linter contracts in pyproject.toml)."""

from __future__ import annotations

from servefleet.core.declarations import Engine
from servefleet.engines.llamacpp import ENGINE as LLAMACPP
from servefleet.engines.vllm import ENGINE as VLLM

ENGINES: tuple[Engine, ...] = (VLLM, LLAMACPP)
