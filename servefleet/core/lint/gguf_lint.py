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
import mmap
import os
import re
import stat
import struct
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGUFValueType

UNCOUNTED_BLOCKS_MISSING = "uncounted_blocks_missing"  # block_count > highest blk index + 1
BLOCKS_NOT_COUNTED = "blocks_not_counted"  # tensors for blocks at or past block_count

# ASCII digits only: llama.cpp names blocks with "blk.%d"; \d would also take other scripts' digits.
_BLK = re.compile(r"^blk\.([0-9]+)\.")
# llama.cpp's split naming: PREFIX-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.ASCII)
# An architecture name goes into llama-server's --override-kv KEY=TYPE:VALUE,... as the key's
# prefix: no separators, no spaces, nothing a flag could be split on.
_ARCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

# --- the header, checked before gguf.GGUFReader sees the file ------------------------------------
# GGUFReader trusts the counts and lengths it reads: a tensor_count of 2**62 or a string of 2**40
# bytes makes it loop, allocate or fail with an IndexError. Every count and length is checked here
# against the bytes that are really left in the file, and against limits no real model comes near.

HEADER_BYTES = 24  # magic, version u32, tensor_count u64, kv_count u64
# GGUFReader spends ~10-30 us and a numpy view per array item and per tensor: these bound its
# time and memory too.
MAX_KV_COUNT = 1 << 16  # real models hold a few dozen metadata keys
MAX_TENSOR_COUNT = 1 << 16  # real models hold at most a few thousand tensors
MAX_ARRAY_ITEMS = 1 << 21  # over all arrays; the largest tokenizers (tokens, scores, types,
#                            merges) hold ~1.3M
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 28
MAX_TENSOR_NAME_BYTES = 63  # llama.cpp: GGML_MAX_NAME (64) including the NUL
MAX_DIMS = 4  # GGML_MAX_DIMS
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (no name, no dims)
MIN_KV_BYTES = 8 + 4 + 1  # key length, type, the smallest value

_SCALAR_BYTES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
_INT_TYPES = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}
_TYPE_NAMES = {int(t): t.name.lower() for t in GGUFValueType}


class GgufError(ValueError):
    """The file is not a GGUF the lint can read; the message is one line naming the file and the
    problem."""


def one_line(text: str, limit: int = 600) -> str:
    """text with control characters escaped, cut to `limit` characters: one printable line."""
    out = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[:limit] + "..."


def _show(raw: bytes | str, limit: int = 60) -> str:
    """An untrusted name or value from the file, quoted and cut short."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class _Header:
    """Walks the header of an mmapped GGUF with every length checked against the file."""

    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0
        self.array_items = 0

    def fail(self, problem: str):
        raise GgufError(f"{self.path}: {problem}")

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            self.fail(f"{what} at byte {self.pos} needs {n} bytes, only {self.size - self.pos} are "
                      f"left in the file ({self.size} bytes): truncated or corrupt")
        at, self.pos = self.pos, self.pos + n
        return at

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str, limit: int) -> bytes | None:
        """Skip a GGUF string (u64 length + bytes); its bytes when it is at most 64 KiB."""
        length = self.u64(f"{what} length")
        if length > limit:
            self.fail(f"{what} is {length} bytes long: more than the {limit} allowed")
        at = self.take(length, f"{what} ({length} bytes)")
        return bytes(self.buf[at:at + length]) if length <= 1 << 16 else None

    def value(self, key: str, vtype: int) -> object:
        """Skip one value of type vtype; return it when it is a scalar or a short string."""
        if vtype == GGUFValueType.STRING:
            return self.string(f"the string value of {key}", MAX_STRING_BYTES)
        if vtype == GGUFValueType.ARRAY:
            itype = self.u32(f"the item type of array {key}")
            if itype == GGUFValueType.ARRAY:
                self.fail(f"{key} is an array of arrays: not supported")
            if itype not in _TYPE_NAMES:
                self.fail(f"{key} is an array of unknown value type {itype}")
            count = self.u64(f"the length of array {key}")
            item_bytes = _SCALAR_BYTES.get(GGUFValueType(itype), 8)  # a string is >= 8 bytes
            if count > (self.size - self.pos) // item_bytes:
                self.fail(f"array {key} claims {count} items of {_TYPE_NAMES[itype]}: more than "
                          f"the {self.size - self.pos} bytes left in the file can hold")
            self.array_items += count
            if self.array_items > MAX_ARRAY_ITEMS:
                self.fail(f"array {key} ({count} items) brings the arrays to {self.array_items} "
                          f"items: more than the {MAX_ARRAY_ITEMS} allowed")
            if itype == GGUFValueType.STRING:
                for i in range(count):
                    self.string(f"item {i} of array {key}", MAX_STRING_BYTES)
            else:
                self.take(count * item_bytes, f"array {key}")
            return None
        size = _SCALAR_BYTES.get(GGUFValueType(vtype)) if vtype in _TYPE_NAMES else None
        if size is None:
            self.fail(f"{key} has unknown value type {vtype}")
        at = self.take(size, f"the value of {key}")
        fmt = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
               GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
               GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<B", GGUFValueType.UINT64: "<Q",
               GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}[GGUFValueType(vtype)]
        return struct.unpack_from(fmt, self.buf, at)[0]


def _open_regular(path: Path) -> tuple[int, int]:
    """(fd, size) of a regular file, opened without blocking (a FIFO would hang a plain open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise GgufError(f"{path}: not a regular file")
    return fd, st.st_size


def check_header(path: str | Path) -> None:
    """Check a GGUF's header, key/value section and tensor infos against its size; GgufError
    naming the first problem. After this, gguf.GGUFReader reads the file within its bounds."""
    path = Path(path)
    fd, size = _open_regular(path)
    try:
        if os.pread(fd, 4, 0) != b"GGUF"[:min(size, 4)] or not size:
            raise GgufError(f"{path}: not a GGUF file (no GGUF magic)")
        if size < HEADER_BYTES:
            raise GgufError(f"{path}: truncated: {size} bytes, a GGUF header needs {HEADER_BYTES}")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            _check_mapped(_Header(path, buf, size))
    finally:
        os.close(fd)


def _check_mapped(h: _Header) -> None:
    if h.buf[:4] != b"GGUF":
        h.fail("not a GGUF file (no GGUF magic)")
    h.pos = 4
    version = h.u32("version")
    if version & 0xFFFF == 0 and version:
        h.fail(f"version field {version:#010x}: a big-endian GGUF, not supported")
    if version not in (2, 3):
        h.fail(f"GGUF version {version}: only versions 2 and 3 are supported")
    tensor_count, kv_count = h.u64("tensor_count"), h.u64("kv_count")
    room = h.size - HEADER_BYTES
    if kv_count > MAX_KV_COUNT or kv_count * MIN_KV_BYTES > room:
        h.fail(f"kv_count {kv_count}: a {h.size}-byte file holds at most "
               f"{min(MAX_KV_COUNT, room // MIN_KV_BYTES)} metadata keys")
    if tensor_count > MAX_TENSOR_COUNT or tensor_count * MIN_TENSOR_INFO_BYTES > room:
        h.fail(f"tensor_count {tensor_count}: a {h.size}-byte file holds at most "
               f"{min(MAX_TENSOR_COUNT, room // MIN_TENSOR_INFO_BYTES)} tensors")

    values: dict[str, tuple[int, object]] = {}
    for i in range(kv_count):
        raw_key = h.string(f"key {i}", MAX_KEY_BYTES)
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            h.fail(f"key {i} ({_show(raw_key)}) is not UTF-8")
        if key in values:
            h.fail(f"duplicate key {_show(key)}")
        vtype = h.u32(f"the value type of {_show(key)}")
        if vtype not in _TYPE_NAMES:
            h.fail(f"{_show(key)} has unknown value type {vtype}")
        values[key] = (vtype, h.value(_show(key), vtype))

    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    if gguf.Keys.General.ALIGNMENT in values:
        vtype, alignment = values[gguf.Keys.General.ALIGNMENT]
        if vtype != GGUFValueType.UINT32:
            h.fail(f"{gguf.Keys.General.ALIGNMENT} is {_TYPE_NAMES[vtype]}: expected uint32")
        if not alignment or alignment & (alignment - 1):
            h.fail(f"{gguf.Keys.General.ALIGNMENT} = {alignment}: expected a power of two")

    tensors = []
    names = set()
    for i in range(tensor_count):
        raw_name = h.string(f"the name of tensor {i}", 1 << 16)
        if len(raw_name) > MAX_TENSOR_NAME_BYTES:
            h.fail(f"tensor {i} name {_show(raw_name)} is {len(raw_name)} bytes: llama.cpp allows "
                   f"{MAX_TENSOR_NAME_BYTES}")
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            h.fail(f"tensor {i} name {_show(raw_name)} is not UTF-8")
        if name in names:
            h.fail(f"duplicate tensor name {_show(name)}")
        names.add(name)
        n_dims = h.u32(f"the dimension count of tensor {_show(name)}")
        if n_dims > MAX_DIMS:
            h.fail(f"tensor {_show(name)} has {n_dims} dimensions: at most {MAX_DIMS}")
        dims = [h.u64(f"the dimensions of tensor {_show(name)}") for _ in range(n_dims)]
        ggml_type = h.u32(f"the type of tensor {_show(name)}")
        if ggml_type not in GGML_QUANT_SIZES:
            h.fail(f"tensor {_show(name)} has unknown type {ggml_type}")
        offset = h.u64(f"the data offset of tensor {_show(name)}")
        n_elements = 1
        for d in dims:
            n_elements *= d
        block, type_size = GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        if n_elements >= 1 << 63 or (dims and dims[0] % block):
            h.fail(f"tensor {_show(name)} has dimensions {dims}: not a valid "
                   f"{gguf.GGMLQuantizationType(ggml_type).name} shape")
        if offset % alignment:
            h.fail(f"tensor {_show(name)} data offset {offset} is not a multiple of the alignment "
                   f"{alignment}")
        tensors.append((name, offset, n_elements // block * type_size))

    data_start = h.pos + (-h.pos % alignment)
    for name, offset, n_bytes in tensors:
        if data_start + offset + n_bytes > h.size:
            h.fail(f"tensor {_show(name)} ({n_bytes} bytes at data offset {offset}) runs past the "
                   f"end of the file ({h.size} bytes): truncated or corrupt")


def _reader(path: Path) -> gguf.GGUFReader:
    """gguf.GGUFReader on a file whose header check_header() has vouched for."""
    check_header(path)
    try:
        return gguf.GGUFReader(path)
    except OSError as exc:
        raise GgufError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, MemoryError,
            RecursionError) as exc:
        raise GgufError(f"{path}: unreadable GGUF ({type(exc).__name__}: {one_line(str(exc), 200)})") \
            from None


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
    if len(types) != 1 or types[0] not in _INT_TYPES:
        raise GgufError(f"{path}: {key} is {'/'.join(t.name.lower() for t in types)}: "
                        f"expected an integer")
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
        raise GgufError(f"{path}: {key} is {'/'.join(t.name.lower() for t in types)}: "
                        f"expected a string")
    raw = f.parts[-1].tobytes()
    arch = raw.decode("utf-8", "replace")
    if not _ARCH.fullmatch(arch):
        raise GgufError(f"{path}: {key} = {_show(arch)}: expected an architecture name "
                        f"(letters, digits, _ -, at most 64)")
    return arch


def _split_paths(path: Path, reader: gguf.GGUFReader) -> list[Path]:
    """All shards of a split GGUF (tensors are spread over them); [path] when not split."""
    count = _int_value(path, reader, gguf.Keys.Split.LLM_KV_SPLIT_COUNT)
    match = _SPLIT.match(path.name)
    if not count or count <= 1 or not match:
        return [path]
    if count != int(match.group("count")):
        raise GgufError(f"{path}: {gguf.Keys.Split.LLM_KV_SPLIT_COUNT} = {count} but the file "
                        f"name says {int(match.group('count'))} shards")
    prefix = match.group("prefix")
    shards = [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [str(p) for p in shards if not p.exists()]
    if missing:
        raise FileNotFoundError(f"split GGUF is incomplete, missing: {', '.join(missing[:3])}"
                                + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    return shards


def _tensor_names(path: Path, reader: gguf.GGUFReader) -> list[str]:
    """Tensor names of a GGUF (all shards of a split GGUF), in file order."""
    names: list[str] = []
    for shard in _split_paths(path, reader):
        names.extend(t.name for t in (reader if shard == path else _reader(shard)).tensors)
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
        path = path.with_name(f"{match.group('prefix')}-00001-of-{match.group('count')}.gguf")
        reader = _reader(path)
    arch = _architecture(path, reader)
    block_count = _int_value(path, reader, gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch))
    nextn_key = gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)
    nextn = _int_value(path, reader, nextn_key)

    indices = [int(m.group(1)) for m in map(_BLK.match, _tensor_names(path, reader)) if m]
    highest = max(indices) if indices else None

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
    parser = argparse.ArgumentParser(description="Lint a GGUF's block_count against its blk.N tensors.")
    parser.add_argument("path", help="a .gguf file (the first shard of a split GGUF)")
    parser.add_argument("--flag", action="store_true", help="print only the --override-kv value (empty when none)")
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
