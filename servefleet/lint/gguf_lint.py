"""GGUF lint: does `{arch}.block_count` match the `blk.N` tensors the file really holds?

A converter that counts an MTP/NextN layer in `block_count` (and sets `nextn_predict_layers`) but
does not emit its tensors produces a file llama.cpp refuses with
`check_tensor_dims: tensor 'blk.N.attn_norm.weight' not found`. Both keys must then be overridden:
only `block_count` makes llama.cpp take the last real block for the NextN block; only
`nextn_predict_layers` leaves the missing block counted. The reverse (tensors for blocks the
metadata does not count) fails too, and needs only `block_count`.

This module is uploaded to nodes and run there with the tools venv's python, so it imports only
`gguf` and the standard library:

    python gguf_lint.py FILE.gguf            # prints the lint as JSON
    python gguf_lint.py --flag FILE.gguf     # prints the --override-kv value, or nothing

GGUFReader memory-maps the file, so this reads headers only, even on a 20 GiB model.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gguf

UNCOUNTED_BLOCKS_MISSING = "uncounted_blocks_missing"  # block_count > highest blk index + 1
BLOCKS_NOT_COUNTED = "blocks_not_counted"  # tensors for blocks at or past block_count

_BLK = re.compile(r"^blk\.(\d+)\.")
# llama.cpp's split naming: PREFIX-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass
class GgufLint:
    """What `servefleet inspect FILE.gguf --json` prints (asdict of this)."""

    arch: str
    block_count: int | None
    highest_block: int | None  # None when the file has no blk.N tensors at all
    nextn_predict_layers: int | None  # None when the key is absent
    defect: str | None  # None, UNCOUNTED_BLOCKS_MISSING or BLOCKS_NOT_COUNTED
    override_kv: list[str] = field(default_factory=list)  # KEY=TYPE:VALUE, no spaces

    def to_dict(self) -> dict:
        return asdict(self)


def _field_value(reader: gguf.GGUFReader, key: str):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def _split_paths(path: Path, reader: gguf.GGUFReader) -> list[Path]:
    """All shards of a split GGUF (tensors are spread over them); [path] when not split."""
    count = _field_value(reader, gguf.Keys.Split.LLM_KV_SPLIT_COUNT)
    match = _SPLIT.match(path.name)
    if not count or int(count) <= 1 or not match:
        return [path]
    prefix = match.group("prefix")
    shards = [path.with_name(f"{prefix}-{i:05d}-of-{int(count):05d}.gguf") for i in range(1, int(count) + 1)]
    missing = [str(p) for p in shards if not p.exists()]
    if missing:
        raise FileNotFoundError(f"split GGUF is incomplete, missing: {', '.join(missing)}")
    return shards


def _tensor_names(path: Path, reader: gguf.GGUFReader) -> list[str]:
    """Tensor names of a GGUF (all shards of a split GGUF), in file order."""
    names: list[str] = []
    for shard in _split_paths(path, reader):
        names.extend(t.name for t in (reader if shard == path else gguf.GGUFReader(shard)).tensors)
    return names


def lint_gguf(path: str | Path) -> GgufLint:
    """Read the header and tensor names of a GGUF and judge block_count against blk.N tensors."""
    path = Path(path)
    reader = gguf.GGUFReader(path)
    split_no = _field_value(reader, gguf.Keys.Split.LLM_KV_SPLIT_NO)
    match = _SPLIT.match(path.name)
    if split_no and match:  # a later shard holds no metadata: read the split from its first shard
        path = path.with_name(f"{match.group('prefix')}-00001-of-{match.group('count')}.gguf")
        reader = gguf.GGUFReader(path)
    arch = _field_value(reader, gguf.Keys.General.ARCHITECTURE)
    if not arch:
        raise ValueError(f"{path}: no general.architecture key: not a model GGUF")
    block_count = _field_value(reader, gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch))
    nextn_key = gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)
    nextn = _field_value(reader, nextn_key)

    indices = [int(m.group(1)) for m in map(_BLK.match, _tensor_names(path, reader)) if m]
    highest = max(indices) if indices else None

    lint = GgufLint(
        arch=str(arch),
        block_count=None if block_count is None else int(block_count),
        highest_block=highest,
        nextn_predict_layers=None if nextn is None else int(nextn),
        defect=None,
    )
    # Without blk tensors (a vocab-only or projector file) there is nothing to compare against.
    if highest is None or lint.block_count is None:
        return lint
    emitted = highest + 1
    fix_count = f"{arch}.block_count=int:{emitted}"
    if lint.block_count > emitted:
        lint.defect = UNCOUNTED_BLOCKS_MISSING
        lint.override_kv = [fix_count]
        # The counted-but-missing blocks are the NextN layer(s): tell llama.cpp there are none,
        # otherwise it takes the last real block for the NextN block. Only a key that exists
        # can be overridden meaningfully.
        if nextn is not None:
            lint.override_kv.append(f"{nextn_key}=int:0")
    elif lint.block_count < emitted:
        lint.defect = BLOCKS_NOT_COUNTED
        lint.override_kv = [fix_count]
    return lint


def override_kv_flag(lint: GgufLint | dict) -> str | None:
    """The single comma-separated value for llama-server's --override-kv; None when no defect.

    One flag rather than repeating it: repeats work but llama.cpp warns that only the last is used.
    """
    overrides = lint["override_kv"] if isinstance(lint, dict) else lint.override_kv
    return ",".join(overrides) if overrides else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lint a GGUF's block_count against its blk.N tensors.")
    parser.add_argument("path", help="a .gguf file (the first shard of a split GGUF)")
    parser.add_argument("--flag", action="store_true", help="print only the --override-kv value (empty when none)")
    args = parser.parse_args(argv)
    try:
        lint = lint_gguf(args.path)
    except (OSError, ValueError) as exc:
        print(f"gguf_lint: {exc}", file=sys.stderr)
        return 2
    if args.flag:
        print(override_kv_flag(lint) or "")
    else:
        print(json.dumps(lint.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
