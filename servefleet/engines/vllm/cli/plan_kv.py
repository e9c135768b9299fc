"""`servefleet plan-kv`: check before deploying that vLLM 0.24.0 will accept a KV-
cache size.

Reproduces the numbers vLLM logs at startup for hybrid (gated-delta-net + full
attention) models: "Setting attention block size", "GPU KV cache size: N
tokens", "Maximum concurrency for N tokens per request", and its refusal when
one max-model-len request does not fit. With --checkpoint it also checks
weights + KV pool + overhead against usable memory."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

from rich.console import Console
from rich.table import Table

from servefleet.core import groupdata, sizes
from servefleet.core.errors import InputError
from servefleet.core.lint.checkpoint import checkpoint_roots, one_line, resolve_inside
from servefleet.engines.vllm.logic import kvplan
from servefleet.fleet.nodes import NODE_CLASSES


def parse_bytes(text: str) -> int:
    """A byte count as everywhere else (core.sizes: 8589934592, 8G, 8GiB, 512M, 1.5GiB), at most
    1 EiB."""
    try:
        value = sizes.parse_size(text)
    except sizes.SizeError as exc:
        raise argparse.ArgumentTypeError(one_line(str(exc))) from None
    if value > kvplan.MAX_KV_CACHE_MEMORY_BYTES:
        raise argparse.ArgumentTypeError(f"{one_line(text[:40])}: more than 1 EiB")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan-kv",
        help="preflight vLLM's KV-cache sizing for a hybrid model",
        description=__doc__,
    )
    p.add_argument("--config", help="config.json of the model (default: CHECKPOINT/config.json)")
    p.add_argument("--max-model-len", type=int, required=True, help="vLLM --max-model-len")
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=parse_bytes,
        required=True,
        help="vLLM --kv-cache-memory-bytes: the KV pool (e.g. 8589934592, 8G or 8GiB)",
    )
    p.add_argument(
        "--block-alignment",
        type=int,
        default=16,
        help="attention kernel block alignment (16 for FLASH_ATTN)",
    )
    p.add_argument(
        "--mamba-ssm-cache-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="vLLM --mamba-ssm-cache-dtype (auto: the config's mamba_ssm_dtype)",
    )
    p.add_argument(
        "--mamba-cache-mode",
        default="none",
        choices=["none", "align"],
        help="none: vLLM's default for hybrid models; align: with --enable-prefix-caching",
    )
    p.add_argument("--checkpoint", help="checkpoint dir: its *.safetensors sizes are the weights")
    p.add_argument(
        "--usable-memory-bytes",
        type=parse_bytes,
        help=f"memory one serving process may use (default with --checkpoint: "
        f"{kvplan.SPARK_USABLE_MEMORY_BYTES // kvplan.GiB} GiB, a DGX Spark)",
    )
    p.add_argument(
        "--node-class",
        choices=[n.name for n in NODE_CLASSES if n.engine],
        help="size the budget for this node class's memory (group_data/<class>.py: a discrete "
        "GPU's own memory, e.g. rtx4090's 24 GiB)",
    )
    p.add_argument(
        "--overhead-bytes",
        type=parse_bytes,
        help=f"non-weight, non-KV memory: CUDA context, activations, CUDA graphs "
        f"(default {kvplan.DEFAULT_OVERHEAD_BYTES // kvplan.GiB} GiB, an estimate)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def class_memory(name: str | None) -> int | None:
    """What a node class's data says one serving process may use: its usable_memory_bytes, or
    for discrete memory one GPU's (gpu_memory_bytes); None for unified memory (the default)."""
    if name is None:
        return None
    data = {**(groupdata.load_group("all") or {}), **(groupdata.load_group(name) or {})}
    if data.get("usable_memory_bytes"):
        return sizes.parse_size(data["usable_memory_bytes"])
    if data.get("memory_model") == "discrete" and data.get("gpu_memory_bytes"):
        return sizes.parse_size(data["gpu_memory_bytes"])
    return None


def _weights_bytes(checkpoint: str) -> int:
    """Sum of the *.safetensors file sizes (HF cache symlinks into its blobs/ followed; a symlink
    leading anywhere else out of the checkpoint is refused, never stat'ed)."""
    directory = Path(checkpoint)
    real_dir, roots = checkpoint_roots(directory)
    files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {checkpoint}")
    total = 0
    for name in files:
        real = resolve_inside(real_dir, name, roots)
        if real is None:
            raise ValueError(f"{directory / name}: a symlink leading out of the checkpoint")
        st = os.stat(real, follow_symlinks=False)  # FileNotFoundError: a dangling symlink
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{directory / name}: not a regular file")
        total += st.st_size
    return total


def run(args) -> int:
    # Every refusal is one line (InputError; servefleet.cli prints it and exits 2).
    if (
        args.usable_memory_bytes is not None
        or args.overhead_bytes is not None
        or args.node_class is not None
    ) and not args.checkpoint:
        raise InputError(
            "--usable-memory-bytes/--node-class/--overhead-bytes need --checkpoint (the weights)"
        )
    config_path = args.config or (args.checkpoint and Path(args.checkpoint) / "config.json")
    if not config_path:
        raise InputError("give --config (or --checkpoint holding config.json)")
    for flag, value, limit in (
        ("--max-model-len", args.max_model_len, kvplan.MAX_MODEL_LEN),
        ("--block-alignment", args.block_alignment, kvplan.MAX_CONFIG_INT),
    ):
        if not 0 < value <= limit:
            raise InputError(f"{flag} {value}: expected 1 to {limit}")
    try:
        config = kvplan.load_config(config_path)
    except (OSError, ValueError) as e:
        raise InputError(one_line(str(e))) from None
    try:
        plan = kvplan.plan_kv(
            config,
            args.max_model_len,
            args.kv_cache_memory_bytes,
            block_alignment=args.block_alignment,
            mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
            mamba_cache_mode=args.mamba_cache_mode,
        )
    except ValueError as e:  # a field of config.json: the message names the key and the value
        raise InputError(one_line(f"{config_path}: {e}")) from None
    bud = None
    if args.checkpoint:
        try:
            weights = _weights_bytes(args.checkpoint)
        except (OSError, ValueError) as e:
            raise InputError(one_line(str(e))) from None
        bud = kvplan.budget(
            weights,
            args.kv_cache_memory_bytes,
            usable_memory_bytes=args.usable_memory_bytes
            or class_memory(args.node_class)
            or kvplan.SPARK_USABLE_MEMORY_BYTES,
            overhead_bytes=(
                kvplan.DEFAULT_OVERHEAD_BYTES
                if args.overhead_bytes is None
                else args.overhead_bytes
            ),
        )

    ok = plan.fits and (bud is None or bud.fits)
    if args.json:
        out = plan.as_dict()
        if bud is not None:
            out.update(bud.as_dict())
        print(json.dumps(out))
        return 0 if ok else 1

    _print_human(Console(highlight=False), plan, bud)
    return 0 if ok else 1


def _print_human(console: Console, plan: kvplan.KVPlan, bud: kvplan.Budget | None) -> None:
    gib = kvplan.format_gib
    table = Table(title="vLLM 0.24.0 KV cache plan", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("Attention block size", f"{plan.block_size:,} tokens")
    table.add_row(
        "KV cache groups", f"{plan.full_groups} full + {plan.mamba_groups} linear attention"
    )
    table.add_row("Layers per group", f"{plan.group_size} ({plan.padding_layers} padding)")
    table.add_row(
        "Bytes per block", f"{plan.bytes_per_block:,} ({plan.group_size} x {plan.page_bytes:,})"
    )
    table.add_row("Blocks in pool", f"{plan.num_blocks:,}")
    table.add_row("Blocks per request", f"{plan.blocks_per_request:,}")
    table.add_row("GPU KV cache size", f"{plan.tokens:,} tokens")
    table.add_row(
        f"Max concurrency ({plan.max_model_len:,} tokens)", f"{plan.max_concurrency:.2f}x"
    )
    table.add_row(
        "Needed for one request", f"{gib(plan.needed_bytes)} GiB ({plan.needed_bytes:,} B)"
    )
    if bud is not None:
        table.add_row("Weights", f"{gib(bud.weights_bytes)} GiB")
        table.add_row(
            "Weights + KV pool + overhead",
            f"{gib(bud.total_bytes)} GiB of {gib(bud.usable_memory_bytes)} GiB usable",
        )
    console.print(table)

    if plan.fits:
        console.print(
            f"[green]OK[/green]: the {gib(plan.kv_cache_memory_bytes)} GiB pool holds "
            f"{plan.max_concurrency:.2f} requests of {plan.max_model_len:,} tokens."
        )
    else:
        hint = (
            f"; it holds at most {plan.estimated_max_model_len:,} tokens per request"
            if plan.estimated_max_model_len
            else ""
        )
        console.print(
            f"[red]REFUSED[/red]: vLLM needs {gib(plan.needed_bytes)} GiB "
            f"({plan.needed_bytes:,} bytes) of KV cache for one {plan.max_model_len:,}-token "
            f"request; the pool is {gib(plan.kv_cache_memory_bytes)} GiB{hint}."
        )
    if bud is not None and not bud.fits:
        console.print(
            f"[red]OVER BUDGET[/red]: weights {gib(bud.weights_bytes)} + KV pool "
            f"{gib(bud.kv_cache_memory_bytes)} + overhead {gib(bud.overhead_bytes)} = "
            f"{gib(bud.total_bytes)} GiB > {gib(bud.usable_memory_bytes)} GiB usable "
            f"(short by {gib(bud.total_bytes - bud.usable_memory_bytes)} GiB)."
        )
