"""What vLLM 0.24.0's KV-cache sizing reads from a hybrid model's config.json, read strictly.

The config is untrusted input (it comes with the checkpoint), so every field is type- and
bound-checked here with a one-line error naming it; kvplan.py does the arithmetic on the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

from servefleet.core.lint.checkpoint import MAX_CONFIG_BYTES, read_json_object

# torch dtype sizes for the dtype strings that configs and vLLM's --mamba-ssm-cache-dtype use.
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}

# Architectures whose config hook (Qwen3_5ForConditionalGenerationConfig in
# vllm/model_executor/models/config.py, MODELS_CONFIG_MAP) copies text_config.mamba_ssm_dtype into
# cache_config.mamba_ssm_cache_dtype. Other architectures (e.g. Qwen3NextForCausalLM) leave it
# "auto", i.e. the SSM state is kept in the model dtype even if the config names a dtype.
MAMBA_SSM_DTYPE_ARCHS = {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}

# model_types whose vLLM config class derives layer_types with a fixed interval of 4, whatever
# full_attention_interval says (vllm/transformers_utils/configs/qwen3_next.py).
FIXED_INTERVAL_MODEL_TYPES = {"qwen3_next"}


@dataclass(frozen=True)
class HybridModel:
    """The fields of hf_text_config that vLLM's KV-cache sizing reads."""

    num_full_layers: int
    num_linear_layers: int
    num_kv_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    model_dtype: str  # also the KV-cache and conv-state dtype (cache dtypes "auto")
    ssm_dtype: str  # temporal (recurrent) state dtype


def dtype_bytes(name: str) -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r} (known: {', '.join(DTYPE_BYTES)})") from None


# Bounds on config integers: far above any real model, low enough that the arithmetic below
# stays exact and printable (a config is untrusted input).
MAX_CONFIG_INT = (1 << 31) - 1
MAX_LAYERS = 100_000
MAX_MODEL_LEN = 1 << 40
MAX_KV_CACHE_MEMORY_BYTES = 1 << 60


def show_value(value) -> str:
    """A config value for an error message: short, one line."""
    if isinstance(value, (dict, list)):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def read_model(config: dict, mamba_ssm_cache_dtype: str = "auto") -> HybridModel:
    """Read a HF config.json dict (nested under text_config or flat) the way vLLM does.

    Fields the sizing needs must be present: a preflight should not guess transformers' defaults.
    Every field read must have the type and range vLLM needs; ValueError naming the key and the
    value otherwise (bool is not an integer here).
    """
    if not isinstance(config, dict):
        raise ValueError(f"config is {show_value(config)}: expected an object")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError(f"text_config = {show_value(text)}: expected an object")
    text = text or config  # ModelConfig.hf_text_config
    prefix = "text_config." if text is not config else ""

    def positive(
        key: str, mapping: dict | None = None, pre: str | None = None, limit: int = MAX_CONFIG_INT
    ) -> int:
        mapping = text if mapping is None else mapping
        pre = prefix if pre is None else pre
        value = mapping[key]
        if (
            not isinstance(value, Integral)
            or isinstance(value, bool)
            or not 0 < int(value) <= limit
        ):
            raise ValueError(
                f"{pre}{key} = {show_value(value)}: expected a positive integer"
                + ("" if limit == MAX_CONFIG_INT else f" of at most {limit}")
            )
        return int(value)

    def need(key: str, limit: int = MAX_CONFIG_INT) -> int:
        if text.get(key) is None:
            raise ValueError(f"config lacks {key}")
        return positive(key, limit=limit)

    def optional(key: str) -> int | None:  # None when absent or null (vLLM's getattr(..., None))
        return None if text.get(key) is None else positive(key)

    def dtype_name(mapping: dict, key: str, pre: str) -> str | None:
        value = mapping.get(key)
        if value is not None and not (
            isinstance(value, str) and (value in DTYPE_BYTES or value == "auto")
        ):
            if isinstance(value, str) and len(value) <= 60:
                raise ValueError(
                    f"{pre}{key} = {value!r}: unsupported dtype (known: {', '.join(DTYPE_BYTES)})"
                )
            raise ValueError(
                f"{pre}{key} = {show_value(value)}: expected a dtype name (known: "
                f"{', '.join(DTYPE_BYTES)})"
            )
        return value

    n_layers = need("num_hidden_layers", limit=MAX_LAYERS)
    layer_types = text.get("layer_types")
    if layer_types is None:
        # Qwen3_5MoeTextConfig.__init__: every full_attention_interval-th layer is full attention;
        # vLLM's Qwen3NextConfig ignores the field and takes every 4th (FIXED_INTERVAL_MODEL_TYPES).
        model_type = text.get("model_type")
        if isinstance(model_type, str) and model_type in FIXED_INTERVAL_MODEL_TYPES:
            interval = 4
        else:
            interval = (
                positive("full_attention_interval") if "full_attention_interval" in text else 4
            )
        layer_types = [
            "linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)
        ]
    elif not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
        raise ValueError(
            f"{prefix}layer_types = {show_value(layer_types)}: expected a list of layer type names"
        )
    elif len(layer_types) < n_layers:
        raise ValueError(
            f"{prefix}layer_types names {len(layer_types)} layers: fewer than "
            f"num_hidden_layers = {n_layers}"
        )
    layer_types = layer_types[:n_layers]
    unknown = set(layer_types) - {"full_attention", "linear_attention"}
    if unknown:
        raise ValueError(
            f"{prefix}layer_types holds unsupported layer types: "
            f"{', '.join(show_value(t) for t in sorted(unknown)[:5])}"
        )
    n_full = layer_types.count("full_attention")
    n_linear = layer_types.count("linear_attention")
    if n_full == 0:
        raise ValueError("no full_attention layers: not an attention/linear-attention hybrid")

    # ModelArchConfigConvertorBase.get_torch_dtype + _resolve_auto_dtype: root dtype first, then
    # text_config's; float32 (also the default when unset) is downcast to bfloat16 on CUDA.
    dtype = (
        dtype_name(config, "dtype", "")
        or dtype_name(config, "torch_dtype", "")
        or dtype_name(text, "dtype", prefix)
        or dtype_name(text, "torch_dtype", prefix)
        or "float32"
    )
    model_dtype = "bfloat16" if dtype in ("float32", "float") else dtype
    dtype_bytes(model_dtype)

    ssm = mamba_ssm_cache_dtype
    archs = config.get("architectures")
    if archs is not None and (
        not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)
    ):
        raise ValueError(f"architectures = {show_value(archs)}: expected a list of class names")
    archs = archs or []
    honours_field = not archs or bool(MAMBA_SSM_DTYPE_ARCHS & set(archs))
    if ssm == "auto" and honours_field and dtype_name(text, "mamba_ssm_dtype", prefix):
        ssm = text["mamba_ssm_dtype"]
    ssm_dtype = (
        model_dtype if ssm == "auto" else ssm
    )  # MambaStateDtypeCalculator._mamba_state_dtype
    dtype_bytes(ssm_dtype)

    def linear(key: str) -> int:  # only a model with linear-attention layers needs these
        return need(key) if n_linear else 0

    # head_dim and num_key_value_heads must be in config.json: without them the config classes
    # vLLM reads these models with (vllm/transformers_utils/configs/qwen3_5*.py, qwen3_next.py)
    # fill in their own defaults (head_dim 256, 2 or 4 KV heads), not get_head_size's
    # hidden/heads or get_total_num_kv_heads' heads fallback. A null head_dim does reach that
    # fallback; a null num_key_value_heads makes vLLM fail (ModelConfig: not an integer).
    for key in ("head_dim", "num_key_value_heads"):
        if key not in text:
            raise ValueError(f"config lacks {key}")
    head_dim = optional("head_dim")
    if head_dim is None:
        hidden, heads = need("hidden_size"), need("num_attention_heads")
        head_dim = hidden // heads
        if head_dim < 1:
            raise ValueError(
                f"{prefix}hidden_size = {hidden} // {prefix}num_attention_heads = "
                f"{heads} gives head_dim 0: expected a positive head size"
            )
    num_kv_heads = positive("num_key_value_heads")
    return HybridModel(
        num_full_layers=n_full,
        num_linear_layers=n_linear,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        linear_num_key_heads=linear("linear_num_key_heads"),
        linear_num_value_heads=linear("linear_num_value_heads"),
        linear_key_head_dim=linear("linear_key_head_dim"),
        linear_value_head_dim=linear("linear_value_head_dim"),
        conv_kernel=linear("linear_conv_kernel_dim"),
        model_dtype=model_dtype,
        ssm_dtype=ssm_dtype,
    )


def load_config(path: str | Path) -> dict:
    """Read a config.json (or a checkpoint dir holding one): a regular file of at most 4 MiB
    holding one JSON object, strict (UTF-8, no duplicate keys, no NaN/Infinity). ValueError or
    OSError with a one-line message naming the file otherwise."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    return read_json_object(p, MAX_CONFIG_BYTES)
