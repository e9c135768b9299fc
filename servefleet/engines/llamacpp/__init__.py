"""llama.cpp, declared once: everything servefleet knows of this engine is in this package.

    logic/         build identity and records, preflights, unit values, sandbox probe, drift's
                   build items; knobs.py: its knobs and owned flags
    facts.py       installed builds, nvcc, the GGUF lint as the service user
    operations.py  build into a versioned prefix, `current`, the GGUF lint
    readers.py     the lint's --override-kv, status's engine line, drift's deep items
    steps.py       the recipe's steps (deploys/serve_q4_llamacpp.py reads them top to bottom)

Its data: group_data/llamacpp.py; its unit template and scripts: files/llamacpp/.
"""

from __future__ import annotations

from servefleet.core.declarations import Engine
from servefleet.engines.llamacpp import logic, readers
from servefleet.engines.llamacpp.logic import knobs

ENGINE = Engine(
    name="llamacpp",
    title="llama.cpp",
    label=logic.ENGINE,
    deploy="serve_q4_llamacpp",
    unit=logic.UNIT,
    template=logic.TEMPLATE,
    version_key="llamacpp_tag",
    knobs=knobs.KNOBS,
    reads=("cuda_architectures",),
    extra_args_key="llamacpp_server_args",
    owned_flags=knobs.OWNED,
    abbreviations=False,
    model_include=logic.model_include,
    unit_context=readers.unit_context,
    status=readers.status,
    deep_items=readers.deep_items,
    health_args=lambda gate, on_node: [],
    release_dirs=lambda lay: [lay.llama_dir],
    current_link=lambda lay: lay.llama_current,
    package=__name__,
)
