"""Safetensors checkpoint lint: what the weights really hold versus what config.json declares.

The tensor facts come from `model.safetensors.index.json` (or the header of a single
`model.safetensors`), never from config.json: a config can declare an MTP block or a vision tower
whose weights were stripped from the upload. Pure functions; nothing here loads tensor data.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# HF checkpoints of Qwen3.5/Qwen3-VL name them model.visual.* / mtp.*; accept the bare and the
# model.-prefixed spelling of both.
_VISUAL = re.compile(r"^(model\.)?visual\.")
_MTP = re.compile(r"^(model\.)?mtp\.")

MTP_WITHOUT_TENSORS = "mtp_declared_no_tensors"
VISION_WITHOUT_WEIGHTS = "vision_tower_no_visual_weights"
MISSING_SHARDS = "missing_shards"


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


def _safetensors_header_names(path: Path) -> list[str]:
    """Tensor names from a .safetensors header (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return [name for name in header if name != "__metadata__"]


def _text_config(config: dict) -> dict:
    # Multimodal Qwen3.5 configs nest the language model's fields under text_config.
    return config.get("text_config") or config


def builds_vision_tower(config: dict) -> bool:
    """Whether loading this config constructs a vision encoder.

    *ForConditionalGeneration classes with a vision_config build one (vLLM: `self.visual = ...`);
    a *ForCausalLM class of the same family does not.
    """
    archs = config.get("architectures") or []
    return bool(config.get("vision_config")) and any(a.endswith("ForConditionalGeneration") for a in archs)


def lint_checkpoint(directory: str | Path) -> CheckpointLint:
    """Lint a checkpoint directory holding config.json and the safetensors index (or one file)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{directory}: no config.json")
    config = json.loads(config_path.read_text())

    index_path = directory / INDEX_FILE
    index_total = None
    if index_path.exists():
        index = json.loads(index_path.read_text())
        weight_map: dict[str, str] = index["weight_map"]
        names = list(weight_map)
        shard_files = sorted(set(weight_map.values()))
        index_total = (index.get("metadata") or {}).get("total_size")
    elif (directory / SINGLE_FILE).exists():
        names = _safetensors_header_names(directory / SINGLE_FILE)
        shard_files = [SINGLE_FILE]
    else:
        raise FileNotFoundError(f"{directory}: neither {INDEX_FILE} nor {SINGLE_FILE}")

    findings: list[Finding] = []
    missing = [s for s in shard_files if not (directory / s).is_file()]
    if not missing:
        total, source = sum((directory / s).stat().st_size for s in shard_files), "shard_files"
    else:
        total, source = (int(index_total), "index_metadata") if index_total is not None else (None, None)
        findings.append(Finding(MISSING_SHARDS, f"{len(missing)} of {len(shard_files)} shard files listed in "
                                f"the index are not in the directory: {', '.join(missing[:3])}"
                                + (" ..." if len(missing) > 3 else "")))

    text = _text_config(config)
    mtp_layers = text.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers"))
    lint = CheckpointLint(
        architecture=(config.get("architectures") or [None])[0],
        tensors=len(names),
        visual_tensors=sum(1 for n in names if _VISUAL.match(n)),
        mtp_tensors=sum(1 for n in names if _MTP.match(n)),
        total_bytes=total,
        total_bytes_source=source,
        mtp_num_hidden_layers=None if mtp_layers is None else int(mtp_layers),
        has_vision_config=bool(config.get("vision_config")),
        builds_vision_tower=builds_vision_tower(config),
        findings=findings,
    )
    if (lint.mtp_num_hidden_layers or 0) > 0 and lint.mtp_tensors == 0:
        findings.append(Finding(MTP_WITHOUT_TENSORS,
                                "config declares MTP but the checkpoint has no MTP tensors: no speculative decoding"))
    if lint.needs_language_model_only:
        findings.append(Finding(VISION_WITHOUT_WEIGHTS,
                                "architecture builds a vision tower, checkpoint has no visual weights: "
                                "needs language-model-only serving (and the vLLM patch)"))
    return lint


def check_recipe(lint: CheckpointLint, language_model_only: bool, *, mtp_speculative: bool = False) -> list[str]:
    """Errors that would stop a serving recipe from loading this checkpoint; [] when it would load.

    language_model_only: the recipe serves without the vision tower (vLLM --language-model-only).
    mtp_speculative: the recipe turns on MTP speculative decoding.
    """
    errors = []
    if lint.needs_language_model_only and not language_model_only:
        errors.append(f"{lint.architecture} builds a vision tower but the checkpoint has no visual weights: "
                      "the recipe must serve language-model-only")
    if mtp_speculative and not lint.has_mtp:
        errors.append("the recipe uses MTP speculative decoding but the checkpoint has no mtp.* tensors")
    return errors
