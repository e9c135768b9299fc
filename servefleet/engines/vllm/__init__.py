"""vLLM, declared once: everything servefleet knows of this engine is in this package.

    logic/       pins, serve argv, unit values, sandbox probe, memory verdict; knobs.py: its
                 knobs and owned flags; kvplan.py + kvmodel.py: plan-kv's KV arithmetic
    facts.py     what is installed in its venv (never importing vLLM), the checkpoint's shards
    operations/  patch.py (qwen3_5.py), preflight.py (checkpoint lint, memory, page cache),
                 health.py (the KV comparison its health check adds)
    readers.py   status's engine line and drift's deep items
    steps.py     the recipe's steps (deploys/serve_bf16.py reads them top to bottom)
    cli/         its `servefleet` sub-commands: plan_kv.py (`servefleet plan-kv`)

Its data: group_data/vllm.py; its unit template: files/vllm/.
"""

from __future__ import annotations

from servefleet.core.declarations import Engine
from servefleet.engines.vllm import logic, readers
from servefleet.engines.vllm.logic import knobs
from servefleet.engines.vllm.operations.health import health_args

ENGINE = Engine(
    name="vllm",
    title="vLLM",
    label=logic.ENGINE,
    deploy="serve_bf16",
    unit=logic.UNIT,
    template=logic.TEMPLATE,
    version_key="vllm_version",
    knobs=knobs.KNOBS,
    reads=("usable_memory_bytes", "memory_model", "gpu_memory_bytes", "model_include"),
    extra_args_key="vllm_extra_args",
    owned_flags=knobs.OWNED,
    abbreviations=True,
    model_include=logic.model_include,
    unit_context=readers.unit_context,
    status=readers.status,
    deep_items=readers.deep_items,
    health_args=health_args,
    release_dirs=lambda lay: [lay.venvs_dir],
    commands=("cli.plan_kv",),
    package=__name__,
)
