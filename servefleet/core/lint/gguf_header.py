"""The GGUF header check that runs before gguf.GGUFReader sees an untrusted file.

Uploaded to nodes beside the lint (as bin/gguf_header.py), so it imports only `gguf`
and the standard library.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from pathlib import Path
from typing import NoReturn

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGUFValueType

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
SHORT_STRING_BYTES = 1 << 16  # strings string() keeps: keys, names, short values

_SCALAR_BYTES = {
    GGUFValueType.UINT8: 1,
    GGUFValueType.INT8: 1,
    GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4,
    GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4,
    GGUFValueType.BOOL: 1,
    GGUFValueType.UINT64: 8,
    GGUFValueType.INT64: 8,
    GGUFValueType.FLOAT64: 8,
}
INT_TYPES = {
    GGUFValueType.UINT8,
    GGUFValueType.INT8,
    GGUFValueType.UINT16,
    GGUFValueType.INT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.UINT64,
    GGUFValueType.INT64,
}
_TYPE_NAMES = {int(t): t.name.lower() for t in GGUFValueType}


class GgufError(ValueError):
    """The file is not a GGUF the lint can read; the message is one line naming the file and the
    problem."""


def one_line(text: str, limit: int = 600) -> str:
    """text with control characters escaped, cut to `limit` characters: one printable line."""
    out = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[:limit] + "..."


def show_raw(raw: bytes | str, limit: int = 60) -> str:
    """An untrusted name or value from the file, quoted and cut short."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class _Header:
    """Walks the header of an mmapped GGUF with every length checked against the file."""

    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0
        self.array_items = 0

    def fail(self, problem: str) -> NoReturn:
        raise GgufError(f"{self.path}: {problem}")

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            self.fail(
                f"{what} at byte {self.pos} needs {n} bytes, only {self.size - self.pos} are "
                f"left in the file ({self.size} bytes): truncated or corrupt"
            )
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
        return bytes(self.buf[at : at + length]) if length <= SHORT_STRING_BYTES else None

    def short_string(self, what: str, limit: int) -> bytes:
        """A GGUF string of at most limit <= SHORT_STRING_BYTES bytes: its bytes."""
        raw = self.string(what, limit)
        if raw is None:  # string() keeps only short ones: a caller's limit above that
            raise AssertionError(f"{what}: short_string's limit {limit} is over 64 KiB")
        return raw

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
                self.fail(
                    f"array {key} claims {count} items of {_TYPE_NAMES[itype]}: more than "
                    f"the {self.size - self.pos} bytes left in the file can hold"
                )
            self.array_items += count
            if self.array_items > MAX_ARRAY_ITEMS:
                self.fail(
                    f"array {key} ({count} items) brings the arrays to {self.array_items} "
                    f"items: more than the {MAX_ARRAY_ITEMS} allowed"
                )
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
        fmt = {
            GGUFValueType.UINT8: "<B",
            GGUFValueType.INT8: "<b",
            GGUFValueType.UINT16: "<H",
            GGUFValueType.INT16: "<h",
            GGUFValueType.UINT32: "<I",
            GGUFValueType.INT32: "<i",
            GGUFValueType.FLOAT32: "<f",
            GGUFValueType.BOOL: "<B",
            GGUFValueType.UINT64: "<Q",
            GGUFValueType.INT64: "<q",
            GGUFValueType.FLOAT64: "<d",
        }[GGUFValueType(vtype)]
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
        if os.pread(fd, 4, 0) != b"GGUF"[: min(size, 4)] or not size:
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
        h.fail(
            f"kv_count {kv_count}: a {h.size}-byte file holds at most "
            f"{min(MAX_KV_COUNT, room // MIN_KV_BYTES)} metadata keys"
        )
    if tensor_count > MAX_TENSOR_COUNT or tensor_count * MIN_TENSOR_INFO_BYTES > room:
        h.fail(
            f"tensor_count {tensor_count}: a {h.size}-byte file holds at most "
            f"{min(MAX_TENSOR_COUNT, room // MIN_TENSOR_INFO_BYTES)} tensors"
        )

    values: dict[str, tuple[int, object]] = {}
    for i in range(kv_count):
        raw_key = h.short_string(f"key {i}", MAX_KEY_BYTES)
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            h.fail(f"key {i} ({show_raw(raw_key)}) is not UTF-8")
        if key in values:
            h.fail(f"duplicate key {show_raw(key)}")
        vtype = h.u32(f"the value type of {show_raw(key)}")
        if vtype not in _TYPE_NAMES:
            h.fail(f"{show_raw(key)} has unknown value type {vtype}")
        values[key] = (vtype, h.value(show_raw(key), vtype))

    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    if gguf.Keys.General.ALIGNMENT in values:
        vtype, value = values[gguf.Keys.General.ALIGNMENT]
        if vtype != GGUFValueType.UINT32 or not isinstance(value, int):  # a uint32 is an int
            h.fail(f"{gguf.Keys.General.ALIGNMENT} is {_TYPE_NAMES[vtype]}: expected uint32")
        alignment = value
        if not alignment or alignment & (alignment - 1):
            h.fail(f"{gguf.Keys.General.ALIGNMENT} = {alignment}: expected a power of two")

    tensors = []
    names = set()
    for i in range(tensor_count):
        raw_name = h.short_string(f"the name of tensor {i}", SHORT_STRING_BYTES)
        if len(raw_name) > MAX_TENSOR_NAME_BYTES:
            h.fail(
                f"tensor {i} name {show_raw(raw_name)} is {len(raw_name)} bytes: llama.cpp allows "
                f"{MAX_TENSOR_NAME_BYTES}"
            )
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            h.fail(f"tensor {i} name {show_raw(raw_name)} is not UTF-8")
        if name in names:
            h.fail(f"duplicate tensor name {show_raw(name)}")
        names.add(name)
        n_dims = h.u32(f"the dimension count of tensor {show_raw(name)}")
        if n_dims > MAX_DIMS:
            h.fail(f"tensor {show_raw(name)} has {n_dims} dimensions: at most {MAX_DIMS}")
        dims = [h.u64(f"the dimensions of tensor {show_raw(name)}") for _ in range(n_dims)]
        ggml_type = h.u32(f"the type of tensor {show_raw(name)}")
        if ggml_type not in GGML_QUANT_SIZES:
            h.fail(f"tensor {show_raw(name)} has unknown type {ggml_type}")
        offset = h.u64(f"the data offset of tensor {show_raw(name)}")
        n_elements = 1
        for d in dims:
            n_elements *= d
        block, type_size = GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        if n_elements >= 1 << 63 or (dims and dims[0] % block):
            h.fail(
                f"tensor {show_raw(name)} has dimensions {dims}: not a valid "
                f"{gguf.GGMLQuantizationType(ggml_type).name} shape"
            )
        if offset % alignment:
            h.fail(
                f"tensor {show_raw(name)} data offset {offset} is not a multiple of the alignment "
                f"{alignment}"
            )
        tensors.append((name, offset, n_elements // block * type_size))

    data_start = h.pos + (-h.pos % alignment)
    for name, offset, n_bytes in tensors:
        if data_start + offset + n_bytes > h.size:
            h.fail(
                f"tensor {show_raw(name)} ({n_bytes} bytes at data offset {offset}) runs past the "
                f"end of the file ({h.size} bytes): truncated or corrupt"
            )
