"""vLLM 0.24.0's own KV-cache sizing for random hybrid (gated-delta-net + full attention) configs.

Runs *inside* the venv holding the real vLLM wheel (servefleet_dev.testing.wheels.vllm_venv), as
a script; imports nothing from servefleet. tests/unit/test_kvplan_differential.py compares its
output with servefleet.engines.vllm.logic.kvplan.plan_kv.

    python kvplan_probe.py --seed S --n N [--cases FILE] [--workdir DIR]

prints one JSON line per case: {"index", "case", "vllm": {...}} or {"index", "case", "error"}.
`--cases FILE` (a JSON list of cases) are run after the N random ones.

Everything in "vllm" comes from vLLM's own objects and functions, not from copies:

- the model: a config.json written to a directory and read by vllm.config.ModelConfig (through
  transformers' real Qwen3.5 / Qwen3-Next config classes), with CacheConfig and VllmConfig; the
  model config hook (Qwen3_5ForConditionalGenerationConfig: mamba_ssm_dtype) and the hybrid
  hook (MambaModelConfig: mamba cache mode, mamba block size) run in VllmConfig.__post_init__;
- block size: vllm.platforms.interface.Platform._align_hybrid_block_size(vllm_config,
  FlashAttentionBackend), the real classmethod with the real VllmConfig and the real
  FLASH_ATTN backend class (it asks the backend for its kernel block sizes and the model class,
  resolved through ModelRegistry, for its mamba state shapes/dtypes);
- per-layer specs: vllm.v1.kv_cache_interface.FullAttentionSpec / MambaSpec filled the way
  Attention.get_kv_cache_spec and MambaBase.get_kv_cache_spec fill them (the layers themselves
  are not built: full-size weights), the mamba shapes/dtypes from
  MambaStateShapeCalculator.gated_delta_net_state_shape /
  MambaStateDtypeCalculator.gated_delta_net_state_dtype with the hf_text_config fields the
  gated-delta-net layer reads;
- groups, pool, refusal, capacity: vllm.v1.core.kv_cache_utils (get_kv_cache_groups ->
  _get_kv_cache_groups_uniform_page_size, get_kv_cache_config_from_groups -> get_num_blocks,
  _pool_bytes_per_block, _max_memory_usage_bytes_from_groups, _estimate_max_model_len_from_groups,
  get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity) and the engine's top-level
  get_kv_cache_configs, whose ValueError is the refusal and whose "GPU KV cache size" /
  "Maximum concurrency" log lines are captured as logged.

Platform: the CPU platform (this runs on machines without a GPU), set before anything else of
vLLM is imported. Where it differs from CUDA for what is sized here, the probe says so:
--block-size is always given (the CPU platform would otherwise pick 128, CUDA's FLASH_ATTN 16),
and AMX detection is turned off (on AMX CPUs the CPU platform disables prefix caching for
linear attention, which CUDA does not; that would make --mamba-cache-mode align unreachable).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import tempfile
from pathlib import Path

GiB = 1 << 30

ARCHS = {
    # architecture: (model_type, text model_type or None for a flat config)
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", "qwen3_5_moe_text"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "qwen3_5_text"),
    "Qwen3NextForCausalLM": ("qwen3_next", None),
}


# --- random cases (pure Python: the test imports this module to regenerate them) ---------------


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def random_case(rng: random.Random) -> dict:
    """One random hybrid config plus serve arguments, in the shapes plan-kv supports.

    Shapes kept out (plan-kv raises ValueError for them, or they are no hybrid): no full-attention
    layer, no linear-attention layer (vLLM would still align the block size to the config's
    mamba state, plan-kv treats it as plain attention), legacy layer-type names, absent
    dimension fields (head_dim, num_key_value_heads, linear_*: the config classes fill in
    defaults, plan-kv refuses to guess them), a null num_key_value_heads (vLLM fails on it).
    Tensor/pipeline parallel 1, no speculative decoding, kv-cache dtype auto.
    """
    arch = rng.choices(list(ARCHS), weights=[6, 2, 2])[0]
    model_type, text_type = ARCHS[arch]
    n_layers = rng.randint(2, 64)
    kv_heads = rng.choice([1, 2, 4, 8, 16])
    head_dim = rng.choice([64, 80, 96, 128, 192, 256])
    k_heads = rng.choice([1, 2, 4, 8, 16, 32])
    text = {
        "hidden_size": rng.choice([512, 1024, 2048, 4096]),
        "num_hidden_layers": n_layers,
        "num_attention_heads": kv_heads * rng.choice([1, 2, 4, 8]),
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": k_heads * rng.choice([1, 2, 4]),
        "linear_key_head_dim": rng.choice([32, 64, 128, 256]),
        "linear_value_head_dim": rng.choice([32, 64, 128, 256]),
        "linear_conv_kernel_dim": rng.choice([2, 3, 4, 5]),
        "max_position_embeddings": 1 << 21,
        "vocab_size": 1024,
    }
    if rng.random() < 0.1:
        # null: vLLM's get_head_size falls back to hidden_size // num_attention_heads (absent,
        # the config class would put in its default, 256, which plan-kv refuses to guess).
        text["head_dim"] = None
    if text_type:
        text["model_type"] = text_type
    # The layer pattern: an interval (the config class derives layer_types), or explicit
    # layer_types. At least 4 layers with an interval alone: vLLM's Qwen3NextConfig ignores
    # full_attention_interval and makes every 4th layer full attention, so fewer layers would
    # leave it without any (a shape plan-kv refuses).
    if rng.random() < 0.5:
        interval = rng.randint(2, 8)
        n_layers = text["num_hidden_layers"] = max(n_layers, interval, 4)
        if rng.random() < 0.85:  # else absent: the default, 4
            text["full_attention_interval"] = interval
        else:
            interval = 4
        if rng.random() < 0.3:  # both, consistent, as published configs have them
            text["layer_types"] = [
                "linear_attention" if (i + 1) % interval else "full_attention"
                for i in range(n_layers)
            ]
    else:
        p_full = rng.uniform(0.05, 0.95)
        types = [
            "full_attention" if rng.random() < p_full else "linear_attention"
            for _ in range(n_layers)
        ]
        if "full_attention" not in types:
            types[rng.randrange(n_layers)] = "full_attention"
        if "linear_attention" not in types:
            types[rng.randrange(n_layers)] = "linear_attention"
        text["layer_types"] = types
    ssm = rng.choice(["float32", "bfloat16", None])
    if ssm:
        text["mamba_ssm_dtype"] = ssm
    dtype = rng.choices(["bfloat16", "float16", "float32"], weights=[5, 4, 1])[0]
    text["dtype"] = dtype
    if text_type:
        config = {
            "architectures": [arch],
            "model_type": model_type,
            "text_config": text,
            "dtype": dtype,
        }
    else:
        config = {"architectures": [arch], "model_type": model_type, **text}

    max_model_len = rng.choice(
        [
            rng.randint(1, 4096),
            _log_uniform(rng, 1, 1 << 20),
            rng.choice([2048, 4096, 8192, 32768, 65536, 131072, 262144, 1 << 20]),
        ]
    )
    case = {
        "config": config,
        "max_model_len": max_model_len,
        "block_alignment": rng.choice([16, 32, 64]),
        "mamba_ssm_cache_dtype": rng.choices(
            ["auto", "float32", "bfloat16", "float16"], weights=[7, 1, 1, 1]
        )[0],
        "mamba_cache_mode": rng.choice(["none", "align"]),
    }
    if rng.random() < 0.2:
        # Right at the refusal boundary: the probe sets the pool to what vLLM says one
        # max_model_len request needs, plus this many bytes.
        case["pool_needed_plus"] = rng.choice([-1, 0, 1])
    else:
        # 1 MiB .. 256 GiB: many of these are too small for max_model_len.
        case["kv_cache_memory_bytes"] = _log_uniform(rng, 1 << 20, 256 * GiB)
    return case


def random_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [random_case(rng) for _ in range(n)]


# --- vLLM's side (runs in the vLLM venv) -------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _setup_vllm() -> dict:
    """Import vLLM on the CPU platform; return what the cases need."""
    # vLLM logs to stdout by default; stdout is for the JSON lines.
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    # optional heavy dependency: vLLM and torch exist only in the loader venv
    import vllm.platforms  # optional heavy dependency
    import vllm.platforms.cpu  # optional heavy dependency

    vllm.platforms._current_platform = vllm.platforms.cpu.CpuPlatform()

    # optional heavy dependency: vLLM and torch exist only in the loader venv
    import torch  # optional heavy dependency

    # CPU-platform only: with AMX, CpuPlatform.check_and_update_config turns prefix caching off
    # for linear attention (the CUDA platform does not), which would make "align" unreachable.
    torch.cpu._is_amx_tile_supported = lambda: False

    # optional heavy dependency: vLLM and torch exist only in the loader venv
    import vllm  # optional heavy dependency
    import vllm.logger  # optional heavy dependency
    from vllm.v1.attention.backends.flash_attn import (
        FlashAttentionBackend,
    )  # optional heavy dependency

    capture = _Capture()
    for name in ("vllm.platforms.interface", "vllm.v1.core.kv_cache_utils"):
        logging.getLogger(name).addHandler(capture)
    # vLLM's own handler: warnings and errors only (per-case INFO lines are noise there).
    for handler in logging.getLogger("vllm").handlers:
        handler.setLevel(logging.WARNING)
    return {"version": vllm.__version__, "backend": FlashAttentionBackend, "capture": capture}


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def vllm_plan(case: dict, workdir: Path, env: dict) -> dict:
    """vLLM's KV numbers for one case (see the module docstring for which function gives what)."""
    import vllm.logger  # optional heavy dependency
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        VllmConfig,
    )  # optional heavy dependency
    from vllm.model_executor.layers.mamba.mamba_utils import (  # optional heavy dependency
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )
    from vllm.model_executor.models import ModelRegistry  # optional heavy dependency
    from vllm.platforms.interface import Platform  # optional heavy dependency
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # optional heavy dependency
    from vllm.v1.attention.backends.registry import (
        MambaAttentionBackendEnum,
    )  # optional heavy dependency
    from vllm.v1.core import kv_cache_utils as kcu  # optional heavy dependency
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec  # optional heavy dependency

    workdir.mkdir(parents=True)  # one directory per case: no config cache can mix them up
    (workdir / "config.json").write_text(json.dumps(case["config"]))
    mode = case["mamba_cache_mode"]
    model_config = ModelConfig(
        model=str(workdir),
        dtype="auto",
        max_model_len=case["max_model_len"],
        skip_tokenizer_init=True,
        enforce_eager=True,
    )
    # --block-size N: user-specified, so the backend's preferred size (16 for FLASH_ATTN) does
    # not replace it and the kernel block alignment is max(16, N) = N.
    # --mamba-cache-mode align is what --enable-prefix-caching gives Qwen3.5 / Qwen3-Next
    # (MambaModelConfig.verify_and_update_config); without it the mode is "none".
    cache_config = CacheConfig(
        block_size=case["block_alignment"],
        enable_prefix_caching=(mode == "align"),
        mamba_ssm_cache_dtype=case["mamba_ssm_cache_dtype"],
    )
    vc = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )
    if cache_config.mamba_cache_mode != mode:
        raise RuntimeError(
            f"vLLM chose mamba_cache_mode {cache_config.mamba_cache_mode!r}, case asks {mode!r}"
        )
    text = model_config.hf_text_config
    parallel = vc.parallel_config

    env["capture"].lines.clear()
    vllm.logger._print_info_once.cache_clear()  # log lines of a repeated shape come again

    # Step 1+2: the hybrid block size and mamba padding, by the platform's own code.
    Platform._align_hybrid_block_size(vc, env["backend"])
    align_lines = list(env["capture"].lines)

    # The specs each layer reports (Attention.get_kv_cache_spec / MambaBase.get_kv_cache_spec).
    kv_dtype = (
        model_config.dtype
        if cache_config.cache_dtype == "auto"
        else STR_DTYPE_TO_TORCH_DTYPE[cache_config.cache_dtype]
    )
    attn_spec = FullAttentionSpec(
        block_size=cache_config.block_size,
        num_kv_heads=model_config.get_num_kv_heads(parallel),
        head_size=model_config.get_head_size(),
        dtype=kv_dtype,
    )
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        parallel.tensor_parallel_size,
        text.linear_num_key_heads,
        text.linear_num_value_heads,
        text.linear_key_head_dim,
        text.linear_value_head_dim,
        text.linear_conv_kernel_dim,
        0,  # no speculative decoding
    )
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        model_config.dtype, cache_config.mamba_cache_dtype, cache_config.mamba_ssm_cache_dtype
    )
    # What _align_hybrid_block_size sized with: the model class's own classmethods.
    model_cls, _ = ModelRegistry.resolve_model_cls(
        model_config.architecture, model_config=model_config
    )
    assert tuple(model_cls.get_mamba_state_shape_from_config(vc)) == tuple(shapes)
    assert tuple(model_cls.get_mamba_state_dtype_from_config(vc)) == tuple(dtypes)
    mamba_spec = MambaSpec(
        shapes=tuple(shapes),
        dtypes=tuple(dtypes),
        block_size=cache_config.mamba_block_size,
        page_size_padded=cache_config.mamba_page_size_padded,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode=cache_config.mamba_cache_mode,
        num_speculative_blocks=0,
    )
    unpadded_mamba = MambaSpec(
        shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=-1
    ).page_size_bytes
    layer_types = list(text.layer_types)[: text.num_hidden_layers]

    def specs() -> dict:
        out = {}
        for i, kind in enumerate(layer_types):
            if kind == "full_attention":
                out[f"model.layers.{i}.self_attn.attn"] = attn_spec
            elif kind == "linear_attention":
                out[f"model.layers.{i}.linear_attn"] = mamba_spec
            else:
                raise ValueError(f"layer type {kind!r}")
        return out

    pool_plus = case.get("pool_needed_plus")

    # Step 3: groups.
    groups = kcu.get_kv_cache_groups(vc, specs())
    group_size = max(len(g.layer_names) for g in groups)
    page = kcu.get_uniform_page_size([g.kv_cache_spec for g in groups])
    needed = kcu._max_memory_usage_bytes_from_groups(vc, groups)
    pool = needed + pool_plus if pool_plus is not None else case["kv_cache_memory_bytes"]

    # Step 4: the engine's own path (refusal check, config, capacity and its log lines).
    env["capture"].lines.clear()
    refusal = None
    try:
        configs = kcu.get_kv_cache_configs(vc, [specs()], [pool])
    except ValueError as exc:
        refusal = str(exc)
        configs = None
    engine_lines = list(env["capture"].lines)
    # The same numbers outside the refusal, for refused cases too.
    kv_config = kcu.get_kv_cache_config_from_groups(vc, groups, pool)
    tokens, concurrency = kcu.get_kv_cache_capacity(vc, kv_config)
    if configs is not None:
        assert configs[0].num_blocks == kv_config.num_blocks
    bytes_per_block = kcu._pool_bytes_per_block(vc, groups)
    assert needed % bytes_per_block == 0

    def logged(prefix: str) -> str | None:
        return next((line for line in engine_lines if line.startswith(prefix)), None)

    return {
        "kv_cache_memory_bytes": pool,
        "model_dtype": _dtype_name(model_config.dtype),
        "kv_cache_dtype": _dtype_name(kv_dtype),
        "mamba_ssm_cache_dtype": cache_config.mamba_ssm_cache_dtype,
        "mamba_state_dtypes": [_dtype_name(d) for d in dtypes],
        "mamba_state_shapes": [list(s) for s in shapes],
        "mamba_cache_mode": cache_config.mamba_cache_mode,
        "num_full_layers": layer_types.count("full_attention"),
        "num_linear_layers": layer_types.count("linear_attention"),
        "num_kv_heads": attn_spec.num_kv_heads,
        "head_size": attn_spec.head_size,
        "attn_bytes_per_token": FullAttentionSpec(
            block_size=1,
            num_kv_heads=attn_spec.num_kv_heads,
            head_size=attn_spec.head_size,
            dtype=kv_dtype,
        ).page_size_bytes,
        "mamba_state_bytes": unpadded_mamba,
        "block_size": cache_config.block_size,
        "mamba_block_size": cache_config.mamba_block_size,
        "page_bytes": page,
        "attn_page_bytes": attn_spec.page_size_bytes,
        "mamba_page_bytes": mamba_spec.page_size_bytes,
        "mamba_padding_bytes": (cache_config.mamba_page_size_padded or unpadded_mamba)
        - unpadded_mamba,
        "groups": [
            [
                "full" if isinstance(g.kv_cache_spec, FullAttentionSpec) else "mamba",
                len(g.layer_names),
            ]
            for g in groups
        ],
        "group_size": group_size,
        "full_groups": sum(isinstance(g.kv_cache_spec, FullAttentionSpec) for g in groups),
        "mamba_groups": sum(isinstance(g.kv_cache_spec, MambaSpec) for g in groups),
        "padding_layers": sum(group_size - len(g.layer_names) for g in groups),
        "bytes_per_block": bytes_per_block,
        "num_blocks": kv_config.num_blocks,
        "blocks_per_request": needed // bytes_per_block,
        "max_concurrency": concurrency,
        "tokens": tokens,
        "needed_bytes": needed,
        "estimated_max_model_len": kcu._estimate_max_model_len_from_groups(vc, groups, pool),
        "refused": refusal is not None,
        "refusal": refusal,
        "log_block_size": next(
            (line for line in align_lines if line.startswith("Setting attention block size")), None
        ),
        "log_tokens": logged("GPU KV cache size:"),
        "log_concurrency": logged("Maximum concurrency for"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--cases", type=Path, help="JSON list of extra cases, run after")
    parser.add_argument("--workdir", type=Path, help="where the config.json files go")
    args = parser.parse_args()

    cases = random_cases(args.seed, args.n)
    if args.cases:
        cases += json.loads(args.cases.read_text())
    env = _setup_vllm()
    print(
        json.dumps({"vllm": env["version"], "seed": args.seed, "n": args.n, "cases": len(cases)}),
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for index, case in enumerate(cases):
            line = {"index": index, "case": case}
            try:
                line["vllm"] = vllm_plan(case, Path(tmp) / f"case-{index}", env)
            except Exception as exc:  # reported per case; the test fails on it
                line["error"] = f"{type(exc).__name__}: {exc}"
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
