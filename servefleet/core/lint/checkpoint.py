"""Safetensors checkpoint lint: what the weights really hold versus what config.json declares.

The tensor facts come from `model.safetensors.index.json` (or the header of a single
`model.safetensors`), never from config.json: a config can declare an MTP block or a vision tower
whose weights were stripped from the upload. Pure functions; nothing here loads tensor data.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servefleet.core.lint.safe_files import (  # noqa: F401  (re-exported for the lint's callers)
    MAX_CONFIG_BYTES,
    CheckpointError,
    checkpoint_roots,
    json_type,
    one_line,
    parse_json_object,
    read_json_object,
    read_regular,
    resolve_inside,
    show,
)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# HF checkpoints of Qwen3.5/Qwen3-VL name them model.visual.* / mtp.*; accept the bare and the
# model.-prefixed spelling of both.
_VISUAL = re.compile(r"^(model\.)?visual\.")
_MTP = re.compile(r"^(model\.)?mtp\.")

MTP_WITHOUT_TENSORS = "mtp_declared_no_tensors"
VISION_WITHOUT_WEIGHTS = "vision_tower_no_visual_weights"
MISSING_SHARDS = "missing_shards"

# Bounds on what a checkpoint's JSON may be: far above real files (a config.json is a few KiB, the
# index of a 1T-parameter MoE ~10 MiB), far below what would exhaust memory.
MAX_INDEX_BYTES = 64 << 20
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
# HF architecture names are Python class names.
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass
class Finding:
    code: str
    message: str


@dataclass
class CheckpointLint:
    """What `servefleet inspect DIR --json` prints (to_dict of this)."""

    architecture: str | None
    tensors: int
    visual_tensors: int
    mtp_tensors: int
    # Sum of the shard files' sizes: the bytes a node downloads and stores (safetensors headers
    # included). The index's metadata.total_size counts tensor data only and is whatever the
    # exporter wrote; it is the fallback when shards are not on disk (total_bytes_source says).
    total_bytes: int | None
    total_bytes_source: str | None  # "shard_files", "index_metadata" or None
    mtp_num_hidden_layers: int | None
    has_vision_config: bool
    builds_vision_tower: bool
    findings: list[Finding] = field(default_factory=list)

    @property
    def needs_language_model_only(self) -> bool:
        """The architecture builds a vision tower the checkpoint has no weights for."""
        return self.builds_vision_tower and self.visual_tensors == 0

    @property
    def has_mtp(self) -> bool:
        return self.mtp_tensors > 0

    def to_dict(self) -> dict:
        return asdict(self)


def check_shard_name(name, key: str, where) -> str:
    """A weight_map value: a relative .safetensors path inside the checkpoint, plain text."""
    problem = None
    if not isinstance(name, str):
        problem = f"is a JSON {json_type(name)}: expected a file name"
    elif not name or any(not ch.isprintable() or ch == "\\" for ch in name):
        problem = "is not a plain file name"
    elif name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        problem = "points outside the checkpoint: expected a file name in it"
    elif any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in name.split("/")):
        problem = "has a path component longer than 255 bytes"
    elif not name.endswith(".safetensors"):
        problem = "is not a .safetensors file"
    if problem:
        raise CheckpointError(f"{where}: weight_map[{show(key)}] = {show(name)} {problem}")
    return name


def _checkpoint_file(real_dir: Path, roots, rel: str, where) -> Path | None:
    """real path of a file of the checkpoint; None when absent; CheckpointError when it leads
    out of the checkpoint."""
    path = resolve_inside(real_dir, rel, roots)
    if path is None:
        raise CheckpointError(
            f"{where}: {show(rel)} is a symlink leading out of the checkpoint directory {real_dir}"
        )
    return path if os.path.lexists(path) else None


def _safetensors_header_names(path: Path, where=None) -> list[str]:
    """Tensor names from a .safetensors header (8-byte little-endian length, then JSON)."""
    where = where or path
    fd = os.open(
        path,
        os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0),
    )
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{where}: not a regular file")
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{where}: truncated: {len(head)} bytes, no safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_SAFETENSORS_HEADER_BYTES, st.st_size - 8):
            raise CheckpointError(
                f"{where}: safetensors header length {length}: more than the "
                f"{min(MAX_SAFETENSORS_HEADER_BYTES, st.st_size - 8)} bytes "
                f"it can be"
            )
        data = f.read(length)
    header = parse_json_object(data, f"{where} header")
    names = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise CheckpointError(
                f"{where} header: tensor {show(name)} is a JSON "
                f"{json_type(entry)}: expected an object"
            )
        names.append(name)
    return names


def builds_vision_tower(config: dict) -> bool:
    """Whether loading this config constructs a vision encoder.

    *ForConditionalGeneration classes with a vision_config build one (vLLM: `self.visual = ...`);
    a *ForCausalLM class of the same family does not.
    """
    archs = config.get("architectures") or []
    return bool(config.get("vision_config")) and any(
        a.endswith("ForConditionalGeneration") for a in archs
    )


def _optional(mapping: dict, key: str, types, what: str, where, prefix: str = ""):
    value = mapping.get(key)
    if value is not None and (
        not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
    ):
        raise CheckpointError(f"{where}: {prefix}{key} = {show(value)}: expected {what}")
    return value


def check_config(config: dict, where) -> dict:
    """The fields of config.json the lint reads, type-checked; returns the text config."""
    text = _optional(config, "text_config", dict, "an object", where) or config
    archs = _optional(config, "architectures", list, "a list of class names", where) or []
    for a in archs:
        if not isinstance(a, str) or not _CLASS_NAME.fullmatch(a):
            raise CheckpointError(f"{where}: architectures holds {show(a)}: expected a class name")
    _optional(config, "vision_config", dict, "an object", where)
    prefix = "text_config." if text is not config else ""
    for mapping, pre in ((text, prefix), (config, "")):
        value = _optional(
            mapping, "mtp_num_hidden_layers", int, "a non-negative integer", where, pre
        )
        if value is not None and value < 0:
            raise CheckpointError(
                f"{where}: {pre}mtp_num_hidden_layers = {value}: expected a non-negative integer"
            )
    return text


def _read_index(path: Path, where) -> tuple[list[str], list[str], int | None]:
    """(tensor names, shard files, metadata.total_size) of a safetensors index."""
    index = read_json_object(path, MAX_INDEX_BYTES, follow_symlinks=False)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(
            f"{where}: weight_map is "
            + ("missing" if weight_map is None else f"a JSON {json_type(weight_map)}")
            + ": expected an object of tensor name -> shard file"
        )
    if not weight_map:
        raise CheckpointError(f"{where}: weight_map is empty: no tensors")
    shards = {check_shard_name(v, k, where) for k, v in weight_map.items()}
    metadata = index.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise CheckpointError(
            f"{where}: metadata is a JSON {json_type(metadata)}: expected an object"
        )
    total = (metadata or {}).get("total_size")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 0):
        raise CheckpointError(
            f"{where}: metadata.total_size = {show(total)}: expected a non-negative integer"
        )
    return list(weight_map), sorted(shards), total


def lint_checkpoint(directory: str | Path) -> CheckpointLint:
    """Lint a checkpoint directory holding config.json and the safetensors index (or one file).

    Reads only files inside the directory (symlinks that lead out of it are refused; a Hugging
    Face cache snapshot's links into its blobs/ are followed). CheckpointError (a ValueError) or
    OSError, with a one-line message, when a file is missing, malformed or unsafe.
    """
    directory = Path(directory)
    real_dir, roots = checkpoint_roots(directory)
    config_path = _checkpoint_file(real_dir, roots, "config.json", directory)
    if config_path is None:
        raise FileNotFoundError(f"{directory}: no config.json")
    config_where = directory / "config.json"
    config = parse_json_object(
        read_regular(config_path, MAX_CONFIG_BYTES, follow_symlinks=False), config_where
    )
    text = check_config(config, config_where)

    index_path = _checkpoint_file(real_dir, roots, INDEX_FILE, directory)
    single_path = None if index_path else _checkpoint_file(real_dir, roots, SINGLE_FILE, directory)
    index_total = None
    if index_path is not None:
        names, shard_files, index_total = _read_index(index_path, directory / INDEX_FILE)
    elif single_path is not None:
        names = _safetensors_header_names(single_path, directory / SINGLE_FILE)
        shard_files = [SINGLE_FILE]
    else:
        raise FileNotFoundError(f"{directory}: neither {INDEX_FILE} nor {SINGLE_FILE}")

    findings: list[Finding] = []
    sizes, missing = {}, []
    total: int | None
    source: str | None
    for shard in shard_files:
        real = _checkpoint_file(real_dir, roots, shard, directory)
        st = None if real is None else os.stat(real, follow_symlinks=False)
        if st is not None and stat.S_ISREG(st.st_mode):
            sizes[shard] = st.st_size
        else:
            missing.append(shard)
    if not missing:
        total, source = sum(sizes.values()), "shard_files"
    else:
        total, source = (index_total, "index_metadata") if index_total is not None else (None, None)
        findings.append(
            Finding(
                MISSING_SHARDS,
                f"{len(missing)} of {len(shard_files)} shard files listed in "
                f"the index are not in the directory: {', '.join(missing[:3])}"
                + (" ..." if len(missing) > 3 else ""),
            )
        )

    mtp_layers = text.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers"))
    lint = CheckpointLint(
        architecture=(config.get("architectures") or [None])[0],
        tensors=len(names),
        visual_tensors=sum(1 for n in names if _VISUAL.match(n)),
        mtp_tensors=sum(1 for n in names if _MTP.match(n)),
        total_bytes=total,
        total_bytes_source=source,
        mtp_num_hidden_layers=mtp_layers,
        has_vision_config=bool(config.get("vision_config")),
        builds_vision_tower=builds_vision_tower(config),
        findings=findings,
    )
    if (lint.mtp_num_hidden_layers or 0) > 0 and lint.mtp_tensors == 0:
        findings.append(
            Finding(
                MTP_WITHOUT_TENSORS,
                "config declares MTP but the checkpoint has no MTP tensors: no speculative decoding",
            )
        )
    if lint.needs_language_model_only:
        findings.append(
            Finding(
                VISION_WITHOUT_WEIGHTS,
                "architecture builds a vision tower, checkpoint has no visual weights: "
                "needs language-model-only serving (and the vLLM patch)",
            )
        )
    return lint


def check_recipe(
    lint: CheckpointLint, language_model_only: bool, *, mtp_speculative: bool = False
) -> list[str]:
    """Errors that would stop a serving recipe from loading this checkpoint; [] when it would load.

    language_model_only: the recipe serves without the vision tower (vLLM --language-model-only).
    mtp_speculative: the recipe turns on MTP speculative decoding.
    """
    errors = []
    if lint.needs_language_model_only and not language_model_only:
        errors.append(
            f"{lint.architecture} builds a vision tower but the checkpoint has no visual weights: "
            "the recipe must serve language-model-only"
        )
    if mtp_speculative and not lint.has_mtp:
        errors.append(
            "the recipe uses MTP speculative decoding but the checkpoint has no mtp.* tensors"
        )
    return errors
