"""KV-cache preflight for hybrid (gated-delta-net + full attention) models, as vLLM 0.24.0 does it.

vLLM sizes the KV cache of a Qwen3.5/Qwen3-Next style model in four steps; each function below
mirrors one of them and names the vLLM code it follows (paths are inside the vllm 0.24.0 wheel):

1. Per-layer page sizes (`vllm/v1/kv_cache_interface.py`):
   FullAttentionSpec.real_page_size_bytes = block_size * kv_heads * (head_dim + head_dim_v) * dtype,
   MambaSpec.page_size_bytes = sum(prod(shape) * dtype) over the gated-delta-net states, whose
   shapes/dtypes come from MambaStateShapeCalculator.gated_delta_net_state_shape and
   MambaStateDtypeCalculator.gated_delta_net_state_dtype (`model_executor/layers/mamba/mamba_utils.py`).
2. The attention block size (`Platform._align_hybrid_block_size`, `vllm/platforms/interface.py`,
   which logs "Setting attention block size"): the smallest multiple of the kernel's block
   alignment whose attention page is >= one mamba state; the mamba page is then padded up to that
   attention page so every layer has the same page size.
3. KV cache groups (`_get_kv_cache_groups_uniform_page_size`, `vllm/v1/core/kv_cache_utils.py`):
   layers are bucketed by spec and each bucket is split into groups of `group_size` layers, where
   group_size = min layers of a type (or the max, when max < 1.5 * min); short groups are padded.
   All groups share `group_size` tensors, so one block costs page_size * group_size bytes.
4. Pool and capacity (`get_kv_cache_config_from_groups` / `get_num_blocks`,
   `_max_memory_usage_bytes_from_groups`, `get_max_concurrency_for_kv_cache_config`,
   `get_kv_cache_capacity`): num_blocks = pool // page // group_size; one request needs
   cdiv(max_model_len, block_size) blocks per full-attention group plus one block (two with
   --mamba-cache-mode align) per mamba group; concurrency = num_blocks / blocks_per_request and the
   logged "GPU KV cache size" is int(concurrency * max_model_len) tokens.

Assumes tensor/pipeline/context parallel size 1, no speculative decoding, kv-cache dtype "auto".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Integral

from servefleet.engines.vllm.logic.kvmodel import (  # noqa: F401  (re-exported: the model side of the plan)
    DTYPE_BYTES,
    MAX_CONFIG_INT,
    MAX_KV_CACHE_MEMORY_BYTES,
    MAX_LAYERS,
    MAX_MODEL_LEN,
    HybridModel,
    dtype_bytes,
    load_config,
    read_model,
    show_value,
)

GiB = 1 << 30

# Memory outside weights and KV cache that a vLLM process holds on a unified-memory box: CUDA
# context, activation peak of the profiling run, CUDA graphs, allocator slack. An estimate for
# planning, not a vLLM figure; pass --overhead-bytes to use a measured one.
DEFAULT_OVERHEAD_BYTES = 4 * GiB
# What a DGX Spark (128 GB unified memory) leaves to one serving process.
SPARK_USABLE_MEMORY_BYTES = 114 * GiB


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vllm.utils.math_utils.cdiv."""
    return -(a // -b)


def format_gib(num_bytes: int) -> str:
    """GiB with 2 decimals, as vllm.utils.mem_utils.format_gib prints it in its refusal."""
    return f"{round(num_bytes / GiB, 2)}"


def attn_bytes_per_token(m: HybridModel) -> int:
    """FullAttentionSpec page size for block_size=1: K and V of every KV head."""
    return m.num_kv_heads * (m.head_dim + m.head_dim) * dtype_bytes(m.model_dtype)


def mamba_state_bytes(m: HybridModel) -> int:
    """Unpadded MambaSpec.page_size_bytes: one request's gated-delta-net state in one layer."""
    if not m.num_linear_layers:
        return 0
    # gated_delta_net_state_shape: conv state (conv_dim, kernel-1) in the conv (model) dtype,
    # temporal state (v_heads, v_dim, k_dim) in the SSM dtype.
    conv_dim = m.linear_key_head_dim * m.linear_num_key_heads * 2 + (
        m.linear_value_head_dim * m.linear_num_value_heads
    )
    conv = conv_dim * (m.conv_kernel - 1) * dtype_bytes(m.model_dtype)
    temporal = (
        m.linear_num_value_heads
        * m.linear_value_head_dim
        * m.linear_key_head_dim
        * dtype_bytes(m.ssm_dtype)
    )
    return conv + temporal


def attention_block_size(m: HybridModel, block_alignment: int = 16) -> int:
    """Platform._align_hybrid_block_size without mamba prefix caching.

    block_alignment is kernel_block_alignment_size there: max(smallest kernel block size of the
    attention backend, the backend's preferred block size), 16 for FLASH_ATTN.
    """
    mamba_page = mamba_state_bytes(m)
    if mamba_page == 0:
        return block_alignment  # not hybrid: the backend's block size stands
    return block_alignment * cdiv(mamba_page, block_alignment * attn_bytes_per_token(m))


@dataclass(frozen=True)
class KVPlan:
    """vLLM's KV-cache numbers for one model, max_model_len and pool size."""

    max_model_len: int
    kv_cache_memory_bytes: int
    block_size: int  # tokens per attention block ("Setting attention block size to ...")
    page_bytes: int  # one block of one layer (mamba pages padded up to this)
    mamba_padding_bytes: int  # padding added to each mamba page
    group_size: int  # layers per KV cache group = tensors sharing the pool
    full_groups: int
    mamba_groups: int
    padding_layers: int  # empty slots in the last group of a type
    bytes_per_block: int  # page_bytes * group_size: what one block id costs in the pool
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float  # unrounded; vLLM logs it with 2 decimals
    tokens: int  # "GPU KV cache size: N tokens"
    needed_bytes: int  # pool needed for one max_model_len request
    estimated_max_model_len: int  # longest request the pool holds (vLLM's refusal hint)

    @property
    def fits(self) -> bool:
        """vLLM refuses to start (ValueError) unless one max_model_len request fits."""
        return self.kv_cache_memory_bytes > 0 and self.needed_bytes <= self.kv_cache_memory_bytes

    def as_dict(self) -> dict:
        keys = (
            "block_size",
            "bytes_per_block",
            "num_blocks",
            "tokens",
            "max_concurrency",
            "needed_bytes",
        )
        out = {k: getattr(self, k) for k in keys}
        out["fits"] = self.fits
        return out


def _blocks_per_request(
    full_groups: int, mamba_groups: int, block_size: int, max_model_len: int, mamba_blocks: int
) -> int:
    # Per group: FullAttentionSpec.max_memory_usage_bytes = cdiv(len, block_size) pages;
    # MambaSpec.max_memory_usage_bytes = 1 page ("none") or 2 ("align"), whatever the length.
    return full_groups * cdiv(max_model_len, block_size) + mamba_groups * mamba_blocks


def plan_kv(
    config: dict,
    max_model_len: int,
    kv_cache_memory_bytes: int,
    block_alignment: int = 16,
    mamba_ssm_cache_dtype: str = "auto",
    mamba_cache_mode: str = "none",
) -> KVPlan:
    """Reproduce vLLM 0.24.0's KV-cache sizing for `config` (a config.json dict).

    mamba_cache_mode "none" is vLLM's default for hybrid models (ModelConfig.
    is_prefix_caching_supported is False for them); "align" is what --enable-prefix-caching gives
    Qwen3.5, which keeps two state blocks per request per mamba group.
    """
    for name, value, limit in (
        ("max_model_len", max_model_len, MAX_MODEL_LEN),
        ("block_alignment", block_alignment, MAX_CONFIG_INT),
    ):
        if not isinstance(value, Integral) or isinstance(value, bool) or not 0 < value <= limit:
            raise ValueError(
                f"{name} = {show_value(value)}: expected a positive integer of at most {limit}"
            )
    if (
        not isinstance(kv_cache_memory_bytes, Integral)
        or isinstance(kv_cache_memory_bytes, bool)
        or not 0 <= kv_cache_memory_bytes <= MAX_KV_CACHE_MEMORY_BYTES
    ):
        raise ValueError(
            f"kv_cache_memory_bytes = {show_value(kv_cache_memory_bytes)}: expected 0 to "
            f"{MAX_KV_CACHE_MEMORY_BYTES} bytes"
        )
    if mamba_cache_mode not in ("none", "align"):
        raise ValueError("mamba_cache_mode must be 'none' or 'align'")
    m = read_model(config, mamba_ssm_cache_dtype)

    block_size = attention_block_size(m, block_alignment)
    page = block_size * attn_bytes_per_token(m)
    mamba_page = mamba_state_bytes(m)

    # _get_kv_cache_groups_uniform_page_size: same-spec layers split into groups of group_size.
    counts = [n for n in (m.num_full_layers, m.num_linear_layers) if n]
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)  # fewer padding layers for near-equal counts
    full_groups = cdiv(m.num_full_layers, group_size)
    mamba_groups = cdiv(m.num_linear_layers, group_size)
    padding = (full_groups + mamba_groups) * group_size - m.num_full_layers - m.num_linear_layers

    # get_num_blocks: int(available_memory // page_size // num_layers), num_layers = group_size.
    num_blocks = max(int(kv_cache_memory_bytes // page // group_size), 0)
    mamba_blocks = 2 if mamba_cache_mode == "align" else 1
    per_request = _blocks_per_request(
        full_groups, mamba_groups, block_size, max_model_len, mamba_blocks
    )

    # get_max_concurrency_for_kv_cache_config divides (group_size * sum of group usages) by
    # (page * group_size): the group_size cancels, leaving blocks per request.
    max_concurrency = num_blocks / per_request
    tokens = int(max_concurrency * max_model_len)  # get_kv_cache_capacity

    def needed(length: int) -> int:  # _max_memory_usage_bytes_from_groups
        n = _blocks_per_request(full_groups, mamba_groups, block_size, length, mamba_blocks)
        return group_size * page * n

    # _estimate_max_model_len_from_groups: binary search over [1, max_model_len].
    best, lo, hi = 0, 1, max_model_len
    while lo <= hi:
        mid = (lo + hi) // 2
        if needed(mid) <= kv_cache_memory_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1

    return KVPlan(
        max_model_len=max_model_len,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        block_size=block_size,
        page_bytes=page,
        mamba_padding_bytes=page - mamba_page if mamba_page else 0,
        group_size=group_size,
        full_groups=full_groups,
        mamba_groups=mamba_groups,
        padding_layers=padding,
        bytes_per_block=page * group_size,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
        max_concurrency=max_concurrency,
        tokens=tokens,
        needed_bytes=needed(max_model_len),
        estimated_max_model_len=best,
    )


@dataclass(frozen=True)
class Budget:
    """Weights + KV pool + overhead against the memory one serving process may use."""

    weights_bytes: int
    kv_cache_memory_bytes: int
    overhead_bytes: int
    usable_memory_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_memory_bytes + self.overhead_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_memory_bytes

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["kv_cache_memory_bytes"]  # already in the plan's JSON as the pool
        d["budget_fits"] = self.fits
        return d


def budget(
    weights_bytes: int,
    kv_cache_memory_bytes: int,
    usable_memory_bytes: int = SPARK_USABLE_MEMORY_BYTES,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
) -> Budget:
    """Check that weights, the KV pool and the overhead fit in usable memory."""
    return Budget(weights_bytes, kv_cache_memory_bytes, overhead_bytes, usable_memory_bytes)
