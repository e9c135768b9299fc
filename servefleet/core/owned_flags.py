"""Engine flags the recipes set from data, which extra arguments may not set again.

vLLM (argparse) and llama.cpp take the last of a repeated flag, so `vllm_extra_args =
["--host", "0.0.0.0"]` would bind every address past the loopback-or-key rule, and
`["--api-key", "..."]` would put the key into argv and the 0644 unit. Each flag below is rendered
by the recipe from the data key named beside it; extra arguments that set it again are refused.
"""

from __future__ import annotations

# flag -> the data key that sets it
VLLM_OWNED = {
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
LLAMACPP_OWNED = {
    "--host": "service_host",
    "--port": "service_port",
    "--api-key": "api_key_file",
    "--api-key-file": "api_key_file",
    "-m": "model_file",
    "--model": "model_file",
    "-mu": "model_file",
    "--model-url": "model_file",
    "-hf": "model_file",
    "--hf-repo": "model_file",
    "-a": "served_model_name",
    "--alias": "served_model_name",
    "-c": "llamacpp_context",
    "--ctx-size": "llamacpp_context",
    "--override-kv": "the GGUF lint (llamacpp_gguf_overrides)",
}
OWNED = {"vllm_extra_args": VLLM_OWNED, "llamacpp_server_args": LLAMACPP_OWNED}


def _name(arg: str, underscores: bool) -> str:
    name = arg.split("=", 1)[0]
    return name.replace("_", "-") if underscores and name.startswith("--") else name


def owned_flag_problems(key: str, args) -> list[str]:
    """One line per argument of `key` that sets a recipe-owned flag: exactly, as --flag=value,
    with underscores (vLLM), or as an argparse abbreviation (a prefix of an owned long flag)."""
    owned = OWNED[key]
    vllm = key == "vllm_extra_args"
    problems = []
    for arg in args or ():
        if not isinstance(arg, str) or not arg.startswith("-") or arg == "-":
            continue
        name = _name(arg, underscores=vllm)
        hit = owned.get(name)
        if hit is None and vllm and name.startswith("--") and len(name) > 3:
            hit = next(
                (who for flag, who in owned.items() if flag.startswith(name) and flag != name), None
            )
        if hit is not None:
            problems.append(
                f"key {key!r}: {arg!r} sets what the recipe sets from {hit}; "
                f"set that instead (extra arguments may not override it)"
            )
    return problems
