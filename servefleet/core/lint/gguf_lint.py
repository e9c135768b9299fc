"""GGUF lint: does `{arch}.block_count` match the `blk.N` tensors the file really holds?

A converter that counts an MTP/NextN layer in `block_count` (and sets `nextn_predict_layers`) but
does not emit its tensors produces a file llama.cpp refuses with
`check_tensor_dims: tensor 'blk.N.attn_norm.weight' not found`. Both keys must then be overridden:
only `block_count` makes llama.cpp take the last real block for the NextN block; only
`nextn_predict_layers` leaves the missing block counted. The reverse (tensors for blocks the
metadata does not count) fails too, and needs only `block_count`.

This module is uploaded to nodes (bin/servefleet-gguf-lint, beside bin/gguf_header.py)
and run there with the tools venv's python, so it imports only `gguf`, the standard library and
its header check:

    python gguf_lint.py FILE.gguf            # prints the lint as JSON
    python gguf_lint.py --flag FILE.gguf     # prints the --override-kv value, or nothing

GGUFReader memory-maps the file, so this reads headers only, even on a 20 GiB model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gguf
from gguf.constants import GGUFValueType

try:  # in the servefleet package
    from servefleet.core.lint.gguf_header import (
        INT_TYPES,
        GgufError,
        check_header,
        one_line,
        show_raw,
    )
except ModuleNotFoundError:  # uploaded to a node: bin/gguf_header.py lies beside this
    # (run with python -I, which leaves the script's own directory off sys.path; bin/ is root's)
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    # The same module by its file name: mypy sees the names bound twice.
    from gguf_header import (  # type: ignore[no-redef]
        INT_TYPES,
        GgufError,
        check_header,
        one_line,
        show_raw,
    )

UNCOUNTED_BLOCKS_MISSING = "uncounted_blocks_missing"  # block_count > highest blk index + 1
BLOCKS_NOT_COUNTED = "blocks_not_counted"  # tensors for blocks at or past block_count

# ASCII digits only: llama.cpp names blocks with "blk.%d"; \d would also take other scripts' digits.
_BLK = re.compile(r"^blk\.([0-9]+)\.")
# The highest block index the lint passes on (as block_count = index + 1, into --override-kv):
# llama.cpp holds at most 512 layers (LLAMA_MAX_LAYERS); a 55-digit index is no model's.
MAX_BLOCK_INDEX = (1 << 16) - 1
# llama.cpp's split naming: PREFIX-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.ASCII)
# An architecture name goes into llama-server's --override-kv KEY=TYPE:VALUE,... as the key's
# prefix: no separators, no spaces, nothing a flag could be split on.
_ARCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _reader(path: Path) -> gguf.GGUFReader:
    """gguf.GGUFReader on a file whose header check_header() has vouched for."""
    check_header(path)
    try:
        return gguf.GGUFReader(path)
    except OSError as exc:
        raise GgufError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        OverflowError,
        MemoryError,
        RecursionError,
    ) as exc:
        raise GgufError(
            f"{path}: unreadable GGUF ({type(exc).__name__}: {one_line(str(exc), 200)})"
        ) from None


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


def _field(reader: gguf.GGUFReader, key: str):
    f = reader.get_field(key)
    return f, (None if f is None else [GGUFValueType(t) for t in f.types])


def _int_value(path: Path, reader: gguf.GGUFReader, key: str) -> int | None:
    """A non-negative integer key; None when absent; GgufError when it is of another type."""
    f, types = _field(reader, key)
    if f is None:
        return None
    if len(types) != 1 or types[0] not in INT_TYPES:
        raise GgufError(
            f"{path}: {key} is {'/'.join(t.name.lower() for t in types)}: expected an integer"
        )
    value = int(f.contents())
    if value < 0:
        raise GgufError(f"{path}: {key} = {value}: expected a non-negative integer")
    return value


def _architecture(path: Path, reader: gguf.GGUFReader) -> str:
    key = gguf.Keys.General.ARCHITECTURE
    f, types = _field(reader, key)
    if f is None:
        raise GgufError(f"{path}: no {key} key: not a model GGUF")
    if types != [GGUFValueType.STRING]:
        raise GgufError(
            f"{path}: {key} is {'/'.join(t.name.lower() for t in types)}: expected a string"
        )
    raw = f.parts[-1].tobytes()
    arch = raw.decode("utf-8", "replace")
    if not _ARCH.fullmatch(arch):
        raise GgufError(
            f"{path}: {key} = {show_raw(arch)}: expected an architecture name "
            f"(letters, digits, _ -, at most 64)"
        )
    return arch


def _model_roots(path: Path) -> list[Path]:
    """Where the files of the GGUF named `path` may really lie: its directory and, in a Hugging
    Face cache snapshot (.../models--ORG--NAME/snapshots/REV/), that repository's blobs/."""
    real_dir = Path(os.path.realpath(path.parent))
    roots = [real_dir]
    if real_dir.parent.name == "snapshots" and real_dir.parent.parent.name.startswith("models--"):
        roots.append(real_dir.parent.parent / "blobs")
    return roots


def _shard(named: Path, shard: Path) -> Path:
    """The real path of a shard the lint reads besides the file it was given: never through a
    symlink that leads out of the model's directory (the lint would read what lies there)."""
    real = Path(os.path.realpath(shard))
    if not any(root in real.parents for root in _model_roots(named)):
        raise GgufError(
            f"{shard}: a symlink leading out of the model's directory "
            f"{named.parent} (to {one_line(str(real), 200)}): refused"
        )
    return real


def _split_paths(path: Path, reader: gguf.GGUFReader) -> list[Path]:
    """All shards of a split GGUF (tensors are spread over them); [path] when not split."""
    count = _int_value(path, reader, gguf.Keys.Split.LLM_KV_SPLIT_COUNT)
    match = _SPLIT.match(path.name)
    if not count or count <= 1 or not match:
        return [path]
    if count != int(match.group("count")):
        raise GgufError(
            f"{path}: {gguf.Keys.Split.LLM_KV_SPLIT_COUNT} = {count} but the file "
            f"name says {int(match.group('count'))} shards"
        )
    prefix = match.group("prefix")
    shards = [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [str(p) for p in shards if not p.exists() and not p.is_symlink()]
    if missing:
        raise FileNotFoundError(
            f"split GGUF is incomplete, missing: {', '.join(missing[:3])}"
            + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        )
    return shards


def _tensor_names(path: Path, reader: gguf.GGUFReader) -> list[str]:
    """Tensor names of a GGUF (all shards of a split GGUF), in file order."""
    names: list[str] = []
    for shard in _split_paths(path, reader):
        names.extend(
            t.name for t in (reader if shard == path else _reader(_shard(path, shard))).tensors
        )
    return names


def lint_gguf(path: str | Path) -> GgufLint:
    """Read the header and tensor names of a GGUF and judge block_count against blk.N tensors.

    GgufError (a ValueError) or OSError, with a one-line message, when the file is not a GGUF the
    lint can read."""
    path = Path(path)
    reader = _reader(path)
    split_no = _int_value(path, reader, gguf.Keys.Split.LLM_KV_SPLIT_NO)
    match = _SPLIT.match(path.name)
    if split_no and match:  # a later shard holds no metadata: read the split from its first shard
        first = path.with_name(f"{match.group('prefix')}-00001-of-{match.group('count')}.gguf")
        reader = _reader(_shard(path, first))
        path = first
    arch = _architecture(path, reader)
    block_count = _int_value(path, reader, gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch))
    nextn_key = gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)
    nextn = _int_value(path, reader, nextn_key)

    blocks = [
        (int(m.group(1)), name) for name in _tensor_names(path, reader) if (m := _BLK.match(name))
    ]
    top = max(blocks) if blocks else None  # (the highest block index, a tensor of it)
    if top is not None and top[0] > MAX_BLOCK_INDEX:
        raise GgufError(
            f"{path}: tensor {show_raw(top[1])} names block {show_raw(str(top[0]), 24)}:"
            f" more than the {MAX_BLOCK_INDEX + 1} blocks any model has"
        )
    highest = top[0] if top is not None else None

    lint = GgufLint(
        arch=arch,
        block_count=block_count,
        highest_block=highest,
        nextn_predict_layers=nextn,
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
    parser = argparse.ArgumentParser(
        description="Lint a GGUF's block_count against its blk.N tensors."
    )
    parser.add_argument("path", help="a .gguf file (the first shard of a split GGUF)")
    parser.add_argument(
        "--flag", action="store_true", help="print only the --override-kv value (empty when none)"
    )
    args = parser.parse_args(argv)
    try:
        lint = lint_gguf(args.path)
    except (OSError, ValueError) as exc:
        print(f"gguf_lint: {one_line(str(exc))}", file=sys.stderr)
        return 2
    if args.flag:
        print(override_kv_flag(lint) or "")
    else:
        print(json.dumps(lint.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
