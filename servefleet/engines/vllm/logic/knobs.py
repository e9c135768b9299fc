"""vLLM's knobs (defaults and docs: group_data/vllm.py) and the `vllm serve` flags the recipe
sets from them, which vllm_extra_args may not set again (servefleet.core.owned_flags)."""

from __future__ import annotations

from servefleet.core import validate as c
from servefleet.core.knobs import ENGINE, TESTBED, Knob as K

OWN = (ENGINE,)

KNOBS = (
    K("vllm_version", c.VERSION, OWN, serving=True),
    K("torch_version", c.VERSION, OWN, serving=True),
    K("torch_cuda", c.pattern("a CUDA version like 13.0", r"\d+\.\d+"), OWN, serving=True),
    K("uv_cache_dir", c.optional(c.ABS_PATH), OWN),
    K("vllm_patch", c.BOOL, OWN, serving=True),
    K("language_model_only", c.BOOL, OWN, serving=True),
    K("trust_remote_code", c.BOOL, OWN, serving=True),
    K("max_model_len", c.integer(1, c.TOKENS_MAX), OWN, serving=True),
    K("kv_cache_memory_bytes", c.optional(c.size(1, c.BYTES_MAX)), OWN, serving=True),
    K("kv_block_alignment", c.integer(1, 2**20), OWN),
    K("memory_overhead_bytes", c.size(0, c.BYTES_MAX), OWN),
    K("page_cache_policy", c.one_of("auto", "always", "never"), OWN),
    K("page_cache_drop_global", c.BOOL, OWN),
    K("vllm_extra_args", c.list_of(c.ARG), OWN, serving=True),
    # testbed only: refused on any host outside the testbed
    K("vllm_executable", c.optional(c.ABS_PATH), OWN, serving=True, scope=TESTBED),
)

# vLLM (argparse) takes the last of a repeated flag, so `vllm_extra_args = ["--host", "0.0.0.0"]`
# would bind every address past the loopback-or-key rule, and `["--api-key", "..."]` would put
# the key into argv and the 0644 unit: each flag below is rendered from the knob beside it.
OWNED = {
    "--host": "service_host",
    "--port": "service_port",
    "--uds": "service_host",
    "--api-key": "api_key_file",
    "--model": "model_repo / model_revision",
    "--served-model-name": "served_model_name",
    "--dtype": "the recipe (bfloat16)",
    "--max-model-len": "max_model_len",
    "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "--language-model-only": "language_model_only",
    "--no-language-model-only": "language_model_only",
    # Runs the repository's own Python as the engine: on only where the data says so.
    "--trust-remote-code": "trust_remote_code",
    "--no-trust-remote-code": "trust_remote_code",
}
