"""Tiny, deterministic model files with the real layouts, for tests and the testbed.

- `build_tiny_checkpoint`: a Qwen3.5-MoE safetensors checkpoint (config.json: AgentWorld's, as in
  shared/agentworld-config.json, with tiny dims; model.safetensors.index.json, 2 BF16 shards), with
  or without `model.visual.*` and `mtp.*` tensors. Names and shapes follow transformers'
  modeling_qwen3_5_moe.py (trunk, vision tower: routed experts fused as `mlp.experts.gate_up_proj`
  [E, 2I, H] / `mlp.experts.down_proj` [E, H, I]) and the MTP block vLLM's qwen3_5_mtp.py and
  llama.cpp's converter read (`mtp.fc`, `mtp.pre_fc_norm_*`, `mtp.norm`, `mtp.layers.0.*` with
  per-expert weights, as published checkpoints ship it).
- `build_tiny_gguf`: a qwen35moe GGUF with the tensor layout llama.cpp's loader
  (src/models/qwen35moe.cpp) expects, a small SentencePiece-style vocabulary and a ChatML chat
  template, so llama-server loads it on CPU and answers a chat completion.

Same arguments → byte-identical files (seeded numpy, sorted tensor order, no timestamps).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------------------------
# Safetensors checkpoint (Qwen3_5MoeForConditionalGeneration)
# ---------------------------------------------------------------------------------------------

TEXT_DIMS = {
    "vocab_size": 512,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "mtp_num_hidden_layers": 1,
    "max_position_embeddings": 4096,
}

VISION_DIMS = {
    "model_type": "qwen3_5_moe_vision",
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 256,  # = text hidden_size: the merger feeds the language model
    "num_position_embeddings": 64,  # a square grid (8x8), as the model requires
    "hidden_act": "gelu_pytorch_tanh",
}


def _agentworld_config() -> dict:
    """Qwen-AgentWorld-35B-A3B's config.json as vLLM reads it (shared/agentworld-config.json)."""
    layers, interval = 40, 4
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "hidden_size": 2048,
            "num_hidden_layers": layers,
            "full_attention_interval": interval,
            "layer_types": [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(layers)
            ],
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "mamba_ssm_dtype": "float32",
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "mtp_num_hidden_layers": 1,
            "max_position_embeddings": 262144,
            "dtype": "bfloat16",
        },
        "vision_config": {"depth": 27, "hidden_size": 1152},
        "dtype": "bfloat16",
    }


AGENTWORLD_CONFIG = _agentworld_config()


def tiny_config(template: dict | None = None) -> dict:
    """The AgentWorld config.json (or template) with tiny dims; nesting and field names unchanged."""
    config = json.loads(json.dumps(template or AGENTWORLD_CONFIG))  # deep copy
    text = config["text_config"]
    text.update(TEXT_DIMS)
    n = text["num_hidden_layers"]
    interval = text["full_attention_interval"]
    text["layer_types"] = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
    ]
    text.update(
        {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "attention_bias": False,
            # partial rotary 0.25 of head_dim 128 → 32 rotary dims → mrope_section must sum to 16
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
            "eos_token_id": 511,
        }
    )
    config["vision_config"] = dict(VISION_DIMS)
    # Special token ids must live inside the tiny vocabulary.
    config.update(
        {
            "image_token_id": 508,
            "video_token_id": 509,
            "vision_start_token_id": 506,
            "vision_end_token_id": 507,
            "tie_word_embeddings": False,
        }
    )
    return config


def _decoder_layer_shapes(prefix: str, t: dict, kind: str, fused_experts: bool) -> dict[str, tuple]:
    """Tensor shapes of one Qwen3_5MoeDecoderLayer (PyTorch [out, in] order)."""
    h, e, i, si = (
        t["hidden_size"],
        t["num_experts"],
        t["moe_intermediate_size"],
        t["shared_expert_intermediate_size"],
    )
    shapes = {
        f"{prefix}.input_layernorm.weight": (h,),
        f"{prefix}.post_attention_layernorm.weight": (h,),
    }
    if kind == "linear_attention":  # Qwen3_5MoeGatedDeltaNet
        key_dim = t["linear_key_head_dim"] * t["linear_num_key_heads"]
        value_dim = t["linear_value_head_dim"] * t["linear_num_value_heads"]
        nv = t["linear_num_value_heads"]
        la = f"{prefix}.linear_attn"
        shapes.update(
            {
                f"{la}.in_proj_qkv.weight": (2 * key_dim + value_dim, h),
                f"{la}.in_proj_z.weight": (value_dim, h),
                f"{la}.in_proj_b.weight": (nv, h),
                f"{la}.in_proj_a.weight": (nv, h),
                f"{la}.conv1d.weight": (2 * key_dim + value_dim, 1, t["linear_conv_kernel_dim"]),
                f"{la}.dt_bias": (nv,),
                f"{la}.A_log": (nv,),
                f"{la}.norm.weight": (t["linear_value_head_dim"],),
                f"{la}.out_proj.weight": (h, value_dim),
            }
        )
    else:  # Qwen3_5MoeAttention: q_proj carries the output gate, hence the factor 2
        hd, nh, nkv = t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
        sa = f"{prefix}.self_attn"
        shapes.update(
            {
                f"{sa}.q_proj.weight": (nh * hd * 2, h),
                f"{sa}.k_proj.weight": (nkv * hd, h),
                f"{sa}.v_proj.weight": (nkv * hd, h),
                f"{sa}.o_proj.weight": (h, nh * hd),
                f"{sa}.q_norm.weight": (hd,),
                f"{sa}.k_norm.weight": (hd,),
            }
        )
    mlp = f"{prefix}.mlp"
    shapes[f"{mlp}.gate.weight"] = (e, h)
    if fused_experts:
        shapes[f"{mlp}.experts.gate_up_proj"] = (e, 2 * i, h)
        shapes[f"{mlp}.experts.down_proj"] = (e, h, i)
    else:
        for x in range(e):
            shapes[f"{mlp}.experts.{x}.gate_proj.weight"] = (i, h)
            shapes[f"{mlp}.experts.{x}.up_proj.weight"] = (i, h)
            shapes[f"{mlp}.experts.{x}.down_proj.weight"] = (h, i)
    shapes.update(
        {
            f"{mlp}.shared_expert.gate_proj.weight": (si, h),
            f"{mlp}.shared_expert.up_proj.weight": (si, h),
            f"{mlp}.shared_expert.down_proj.weight": (h, si),
            f"{mlp}.shared_expert_gate.weight": (1, h),
        }
    )
    return shapes


def _vision_shapes(v: dict) -> dict[str, tuple]:
    """Tensor shapes of Qwen3_5MoeVisionModel under model.visual."""
    d, inter, p, tp = (
        v["hidden_size"],
        v["intermediate_size"],
        v["patch_size"],
        v["temporal_patch_size"],
    )
    merged = d * v["spatial_merge_size"] ** 2
    shapes = {
        "model.visual.patch_embed.proj.weight": (d, v["in_channels"], tp, p, p),
        "model.visual.patch_embed.proj.bias": (d,),
        "model.visual.pos_embed.weight": (v["num_position_embeddings"], d),
    }
    for b in range(v["depth"]):
        blk = f"model.visual.blocks.{b}"
        shapes.update(
            {
                f"{blk}.norm1.weight": (d,),
                f"{blk}.norm1.bias": (d,),
                f"{blk}.norm2.weight": (d,),
                f"{blk}.norm2.bias": (d,),
                f"{blk}.attn.qkv.weight": (3 * d, d),
                f"{blk}.attn.qkv.bias": (3 * d,),
                f"{blk}.attn.proj.weight": (d, d),
                f"{blk}.attn.proj.bias": (d,),
                f"{blk}.mlp.linear_fc1.weight": (inter, d),
                f"{blk}.mlp.linear_fc1.bias": (inter,),
                f"{blk}.mlp.linear_fc2.weight": (d, inter),
                f"{blk}.mlp.linear_fc2.bias": (d,),
            }
        )
    shapes.update(
        {
            "model.visual.merger.norm.weight": (d,),
            "model.visual.merger.norm.bias": (d,),
            "model.visual.merger.linear_fc1.weight": (merged, merged),
            "model.visual.merger.linear_fc1.bias": (merged,),
            "model.visual.merger.linear_fc2.weight": (v["out_hidden_size"], merged),
            "model.visual.merger.linear_fc2.bias": (v["out_hidden_size"],),
        }
    )
    return shapes


def checkpoint_tensor_shapes(
    config: dict, *, visual: bool = True, mtp: bool = True
) -> dict[str, tuple]:
    """Every tensor name → shape of a Qwen3.5-MoE checkpoint for this config."""
    t = config["text_config"]
    h, vocab = t["hidden_size"], t["vocab_size"]
    shapes: dict[str, tuple] = {
        "model.language_model.embed_tokens.weight": (vocab, h),
        "model.language_model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    for n, kind in enumerate(t["layer_types"]):
        shapes.update(
            _decoder_layer_shapes(f"model.language_model.layers.{n}", t, kind, fused_experts=True)
        )
    if visual:
        shapes.update(_vision_shapes(config["vision_config"]))
    if mtp:
        shapes.update(
            {
                "mtp.fc.weight": (h, 2 * h),  # [embedding ; hidden] → hidden
                "mtp.pre_fc_norm_embedding.weight": (h,),
                "mtp.pre_fc_norm_hidden.weight": (h,),
                "mtp.norm.weight": (h,),
            }
        )
        for n in range(t.get("mtp_num_hidden_layers", 1)):
            shapes.update(
                _decoder_layer_shapes(f"mtp.layers.{n}", t, "full_attention", fused_experts=False)
            )
    return shapes


def _rng(seed: int, name: str) -> np.random.Generator:
    """One generator per tensor: a tensor's values do not depend on which others are written."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _bf16_bytes(values: np.ndarray) -> bytes:
    """float32 → bfloat16 (round to nearest even), little-endian bytes. numpy has no bf16."""
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(
    path: Path, tensors: dict[str, bytes], shapes: dict[str, tuple], dtype: str = "BF16"
) -> int:
    """Write a safetensors file (8-byte header length, JSON header, raw data); returns data bytes.

    Written by hand because numpy cannot hold bfloat16; `safetensors.safe_open` reads it back.
    """
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in tensors:
        size = len(tensors[name])
        header[name] = {
            "dtype": dtype,
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in tensors:
            f.write(tensors[name])
    return offset


def build_tiny_checkpoint(
    directory: str | Path, *, visual: bool = True, mtp: bool = True, seed: int = 0, shards: int = 2
) -> Path:
    """Write a tiny Qwen3.5-MoE checkpoint into directory and return it.

    visual=False / mtp=False leave out the `model.visual.*` / `mtp.*` tensors while config.json
    still declares the vision tower and `mtp_num_hidden_layers` (what the lints look for).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    shapes = checkpoint_tensor_shapes(config, visual=visual, mtp=mtp)
    names = sorted(shapes)
    data = {
        n: _bf16_bytes(_rng(seed, n).normal(0.0, 0.02, size=shapes[n]).astype(np.float32))
        for n in names
    }

    # Cut the sorted list into shards of about equal size, like save_pretrained's max_shard_size.
    total = sum(len(b) for b in data.values())
    files = [f"model.safetensors-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    groups: list[dict[str, bytes]] = [{} for _ in range(shards)]
    running = 0
    for n in names:
        k = min(shards - 1, running * shards // total)
        groups[k][n] = data[n]
        running += len(data[n])
    weight_map = {}
    for file, group in zip(files, groups, strict=False):
        write_safetensors(directory / file, group, shapes)
        weight_map.update({n: file for n in group})

    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


# ---------------------------------------------------------------------------------------------
# GGUF (qwen35moe)
# ---------------------------------------------------------------------------------------------

GGUF_ARCH = "qwen35moe"

GGUF_DIMS = {
    "n_embd": 64,
    "n_head": 2,
    "n_head_kv": 1,
    "head_dim": 32,
    "n_expert": 4,
    "n_expert_used": 2,
    "n_ff_exp": 32,
    "n_ff_shexp": 32,
    "ssm_d_conv": 4,
    "ssm_d_state": 16,  # linear-attention head dim (keys and values)
    "ssm_n_group": 2,  # linear-attention key heads
    "ssm_dt_rank": 4,  # linear-attention value heads
    "full_attention_interval": 4,
    "context_length": 4096,
}

# The layouts build_tiny_gguf can write; n_layers is always the number of real trunk blocks.
GGUF_CLEAN = "clean"  # block_count = n_layers, no nextn key
GGUF_MTP = (
    "mtp"  # block_count = n_layers + 1, nextn_predict_layers = 1, blk.n_layers is a full MTP block
)
GGUF_MISSING_MTP = "missing_mtp"  # the defect: MTP counted (block_count, nextn key) but not emitted
GGUF_UNCOUNTED = "uncounted"  # the reverse: block_count = n_layers - 1, tensors for n_layers blocks
# The field file's shape (the RTX 4090's Q4 GGUF): missing_mtp with the real model's 40 trunk
# blocks, so block_count = 41, nextn_predict_layers = 1 and tensors for blk.0-39 only.
GGUF_FIELD_MISSING_MTP = "field_missing_mtp"
GGUF_LAYOUTS = (GGUF_CLEAN, GGUF_MTP, GGUF_MISSING_MTP, GGUF_UNCOUNTED, GGUF_FIELD_MISSING_MTP)
FIELD_LAYERS = 40  # Qwen-AgentWorld-35B-A3B's num_hidden_layers
DEFAULT_GGUF_LAYERS = 4

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: specials, ASCII byte-fallback pieces, a few words."""
    import gguf  # optional heavy dependency: the GPU probe builds checkpoints without it

    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4
    # Byte fallback for ASCII only: whatever a random model samples decodes to valid UTF-8
    # (a lone 0x80-0xFF byte is not, and b9785's server answers such a reply with a 500).
    tokens += [f"<0x{b:02X}>" for b in range(128)]
    types += [gguf.TokenType.BYTE] * 128
    words = ["▁", "▁the", "▁a", "▁is", "▁hello", "▁world", "▁model", "▁fleet", "▁node", "▁ok"]
    words += [f"▁{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list(
        "abcdefghijklmnopqrstuvwxyz.,!?"
    )
    words = list(dict.fromkeys(words))  # llama.cpp asserts every piece is unique
    tokens += words
    types += [gguf.TokenType.NORMAL] * len(words)
    scores = [0.0] * (len(tokens) - len(words)) + [-float(k) for k in range(len(words))]
    return tokens, scores, [int(t) for t in types]


def _gguf_block_tensors(bid: int, recurrent: bool, mtp: bool, d: dict) -> dict[str, tuple]:
    """Tensor name → ggml ne (innermost first) of one qwen35moe block, as the loader checks them."""
    e, hd = d["n_embd"], d["head_dim"]
    key_dim = d["ssm_d_state"] * d["ssm_n_group"]
    value_dim = d["ssm_d_state"] * d["ssm_dt_rank"]
    b = f"blk.{bid}"
    ne = {f"{b}.attn_norm.weight": (e,), f"{b}.post_attention_norm.weight": (e,)}
    if recurrent:
        ne.update(
            {
                f"{b}.attn_qkv.weight": (e, 2 * key_dim + value_dim),
                f"{b}.attn_gate.weight": (e, value_dim),
                f"{b}.ssm_conv1d.weight": (d["ssm_d_conv"], 2 * key_dim + value_dim),
                f"{b}.ssm_dt.bias": (d["ssm_dt_rank"],),
                f"{b}.ssm_a": (d["ssm_dt_rank"],),
                f"{b}.ssm_beta.weight": (e, d["ssm_dt_rank"]),
                f"{b}.ssm_alpha.weight": (e, d["ssm_dt_rank"]),
                f"{b}.ssm_norm.weight": (d["ssm_d_state"],),
                f"{b}.ssm_out.weight": (value_dim, e),
            }
        )
    else:
        ne.update(
            {
                f"{b}.attn_q.weight": (e, hd * d["n_head"] * 2),  # query + output gate
                f"{b}.attn_k.weight": (e, hd * d["n_head_kv"]),
                f"{b}.attn_v.weight": (e, hd * d["n_head_kv"]),
                f"{b}.attn_output.weight": (hd * d["n_head"], e),
                f"{b}.attn_q_norm.weight": (hd,),
                f"{b}.attn_k_norm.weight": (hd,),
            }
        )
    ne.update(
        {
            f"{b}.ffn_gate_inp.weight": (e, d["n_expert"]),
            f"{b}.ffn_gate_exps.weight": (e, d["n_ff_exp"], d["n_expert"]),
            f"{b}.ffn_up_exps.weight": (e, d["n_ff_exp"], d["n_expert"]),
            f"{b}.ffn_down_exps.weight": (d["n_ff_exp"], e, d["n_expert"]),
            f"{b}.ffn_gate_inp_shexp.weight": (e,),
            f"{b}.ffn_gate_shexp.weight": (e, d["n_ff_shexp"]),
            f"{b}.ffn_up_shexp.weight": (e, d["n_ff_shexp"]),
            f"{b}.ffn_down_shexp.weight": (d["n_ff_shexp"], e),
        }
    )
    if mtp:
        ne.update(
            {
                f"{b}.nextn.eh_proj.weight": (2 * e, e),
                f"{b}.nextn.enorm.weight": (e,),
                f"{b}.nextn.hnorm.weight": (e,),
                f"{b}.nextn.shared_head_norm.weight": (e,),
            }
        )
    return ne


def _gguf_values(name: str, ne: tuple, seed: int) -> np.ndarray:
    """Values that keep a forward pass finite: unit norms, negative decay, small weights."""
    rng = _rng(seed, name)
    shape = tuple(reversed(ne))  # numpy order is ggml's ne reversed
    if name.endswith("norm.weight") or name.endswith("norm"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith(".ssm_a"):  # converters store -exp(A_log): must be negative
        return -np.exp(rng.normal(0.0, 0.5, size=shape)).astype(np.float32)
    if name.endswith(".ssm_dt.bias"):
        return np.zeros(shape, dtype=np.float32)
    return rng.normal(0.0, 0.05, size=shape).astype(np.float32)


def build_tiny_gguf(
    path: str | Path, *, layout: str = GGUF_CLEAN, n_layers: int | None = None, seed: int = 0
) -> Path:
    """Write a tiny qwen35moe GGUF with the given layout (see GGUF_LAYOUTS) and return its path.

    n_layers (default 4; GGUF_FIELD_MISSING_MTP: always FIELD_LAYERS) is the number of real
    trunk blocks. GGUF_MISSING_MTP reproduces the defect: block_count = n_layers + 1 and
    nextn_predict_layers = 1 with tensors for blk.0..n_layers-1 only; llama.cpp then fails on
    blk.{n_layers}.attn_norm.weight. GGUF_FIELD_MISSING_MTP is that defect at the field file's
    depth: block_count 41, nextn 1, blk.0-39 (every 4th block full attention), ~8 MB.
    """
    import gguf  # optional heavy dependency: the GPU probe builds checkpoints without it

    if layout not in GGUF_LAYOUTS:
        raise ValueError(f"layout must be one of {GGUF_LAYOUTS}, not {layout!r}")
    if layout == GGUF_FIELD_MISSING_MTP:
        if n_layers not in (None, FIELD_LAYERS):
            raise ValueError(f"layout {layout!r} has {FIELD_LAYERS} blocks, not {n_layers}")
        n_layers = FIELD_LAYERS
    elif n_layers is None:
        n_layers = DEFAULT_GGUF_LAYERS
    d = GGUF_DIMS
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = tiny_vocab()
    n_vocab = len(tokens)

    block_count = {
        GGUF_CLEAN: n_layers,
        GGUF_MTP: n_layers + 1,
        GGUF_MISSING_MTP: n_layers + 1,
        GGUF_UNCOUNTED: n_layers - 1,
        GGUF_FIELD_MISSING_MTP: n_layers + 1,
    }[layout]
    w = gguf.GGUFWriter(path, GGUF_ARCH)
    w.add_name(f"tiny-{GGUF_ARCH}-{layout}")
    w.add_context_length(d["context_length"])
    w.add_embedding_length(d["n_embd"])
    w.add_block_count(block_count)
    if layout in (GGUF_MTP, GGUF_MISSING_MTP, GGUF_FIELD_MISSING_MTP):
        w.add_nextn_predict_layers(1)
    w.add_head_count(d["n_head"])
    w.add_head_count_kv(d["n_head_kv"])
    w.add_key_length(d["head_dim"])
    w.add_value_length(d["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10_000_000.0)
    w.add_rope_dimension_count(d["head_dim"] // 4)  # partial rotary 0.25
    w.add_rope_dimension_sections([2, 1, 1, 0])  # sums to rotary dims / 2, like [11, 11, 10, 0]
    w.add_expert_count(d["n_expert"])
    w.add_expert_used_count(d["n_expert_used"])
    w.add_expert_feed_forward_length(d["n_ff_exp"])
    w.add_expert_shared_feed_forward_length(d["n_ff_shexp"])
    w.add_ssm_conv_kernel(d["ssm_d_conv"])
    w.add_ssm_state_size(d["ssm_d_state"])
    w.add_ssm_group_count(d["ssm_n_group"])
    w.add_ssm_time_step_rank(d["ssm_dt_rank"])
    w.add_ssm_inner_size(d["ssm_d_state"] * d["ssm_dt_rank"])
    w.add_full_attention_interval(d["full_attention_interval"])

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    ne: dict[str, tuple] = {
        "token_embd.weight": (d["n_embd"], n_vocab),
        "output_norm.weight": (d["n_embd"],),
        "output.weight": (d["n_embd"], n_vocab),
    }
    interval = d["full_attention_interval"]
    for bid in range(n_layers):
        ne.update(_gguf_block_tensors(bid, recurrent=(bid + 1) % interval != 0, mtp=False, d=d))
    if layout == GGUF_MTP:
        ne.update(_gguf_block_tensors(n_layers, recurrent=False, mtp=True, d=d))

    for name, shape in ne.items():
        w.add_tensor(name, _gguf_values(name, shape, seed))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
