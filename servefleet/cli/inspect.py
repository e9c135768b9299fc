"""`servefleet inspect PATH [--json]`: lint a model before it is deployed.

PATH is a GGUF file (block_count versus blk.N tensors, and the --override-kv
that fixes a mismatch) or a safetensors checkpoint directory (tensor counts
from the index, findings against config.json). Exit status: 0 inspected, 1 with
--strict when there is a defect or a finding, 2 when PATH cannot be read as
either (one line naming the file and the problem)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servefleet.core.errors import InputError
from servefleet.core.lint.checkpoint import CheckpointLint, lint_checkpoint, one_line

if TYPE_CHECKING:  # gguf (and numpy) imported only to lint a GGUF: every servefleet run loads this
    from servefleet.core.lint.gguf_lint import GgufLint

GGUF_MAGIC = b"GGUF"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="lint a GGUF file or a safetensors checkpoint directory",
        description=__doc__,
    )
    parser.add_argument("path", type=Path, help="a .gguf file or a checkpoint directory")
    parser.add_argument("--json", action="store_true", help="print the lint as one JSON object")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a defect or finding is reported"
    )
    parser.set_defaults(func=run)


def _is_gguf(path: Path) -> bool:
    """Whether a regular file starts with the GGUF magic (opened without blocking: a FIFO)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
        return os.read(fd, 4) == GGUF_MAGIC
    finally:
        os.close(fd)


def inspect_path(path: Path) -> GgufLint | CheckpointLint:
    """Lint PATH with the lint that fits it; raises ValueError/OSError (one-line messages) when
    none does."""
    if path.is_dir():
        return lint_checkpoint(path)
    if path.exists():
        if _is_gguf(path):
            # gguf and numpy: an optional heavy dependency, loaded only to lint a GGUF
            from servefleet.core.lint.gguf_lint import lint_gguf

            return lint_gguf(path)
        if path.name in ("config.json", "model.safetensors.index.json"):
            return lint_checkpoint(path.parent)
        raise ValueError(f"{path}: not a GGUF file (no GGUF magic) and not a checkpoint directory")
    raise FileNotFoundError(f"{path}: no such file or directory")


def _show_gguf(console: Console, path: Path, lint: GgufLint) -> None:
    # gguf and numpy: an optional heavy dependency, loaded only to lint a GGUF
    from servefleet.core.lint.gguf_lint import override_kv_flag

    table = Table(title=escape(f"GGUF {path}"), show_header=False)
    for key in ("arch", "block_count", "highest_block", "nextn_predict_layers"):
        value = getattr(lint, key)
        table.add_row(key, "-" if value is None else escape(str(value)))
    console.print(table)
    if lint.defect is None:
        console.print("[green]block_count matches the blk.N tensors[/green]")
        return
    highest = lint.highest_block
    if highest is None:  # lint_gguf compares block_count with blk.N tensors only where there are
        raise ValueError(f"{path}: defect {lint.defect} reported without blk.N tensors")
    if lint.defect == "uncounted_blocks_missing":
        console.print(
            f"[red]defect[/red] {lint.defect}: block_count {lint.block_count} counts blocks the file "
            f"does not hold (highest blk index {lint.highest_block}); llama-server fails with "
            f"'blk.{highest + 1}.attn_norm.weight' not found"
        )
    else:
        console.print(
            f"[red]defect[/red] {lint.defect}: tensors for blk.0..blk.{lint.highest_block} "
            f"({highest + 1} blocks) but block_count is {lint.block_count}"
        )
    console.print(
        f"fix: llama-server --override-kv {override_kv_flag(lint)}", soft_wrap=True, markup=False
    )


def _show_checkpoint(console: Console, path: Path, lint: CheckpointLint) -> None:
    table = Table(title=escape(f"checkpoint {path}"), show_header=False)
    total = "-" if lint.total_bytes is None else f"{lint.total_bytes:,} ({lint.total_bytes_source})"
    rows = [
        ("architecture", lint.architecture or "-"),
        ("tensors", str(lint.tensors)),
        ("visual tensors", str(lint.visual_tensors)),
        ("mtp tensors", str(lint.mtp_tensors)),
        ("total bytes", total),
        (
            "mtp_num_hidden_layers",
            "-" if lint.mtp_num_hidden_layers is None else str(lint.mtp_num_hidden_layers),
        ),
        ("vision_config", "yes" if lint.has_vision_config else "no"),
    ]
    for key, value in rows:
        table.add_row(key, escape(value))
    console.print(table)
    if not lint.findings:
        console.print("[green]no findings[/green]")
    for finding in lint.findings:  # messages quote shard names from the index: no markup
        console.print(
            f"[yellow]{finding.code}[/yellow]: {escape(one_line(finding.message))}", soft_wrap=True
        )


def run(args) -> int:
    try:
        lint = inspect_path(args.path)
    except (OSError, ValueError) as exc:
        # One line naming the file and the problem; servefleet.cli prints it and exits 2.
        raise InputError(one_line(str(exc))) from None
    console = Console()
    if args.json:
        print(json.dumps(lint.to_dict()))
    elif isinstance(lint, CheckpointLint):
        _show_checkpoint(console, args.path, lint)
    else:
        _show_gguf(console, args.path, lint)
    flagged = bool(lint.findings) if isinstance(lint, CheckpointLint) else lint.defect is not None
    return 1 if args.strict and flagged else 0
