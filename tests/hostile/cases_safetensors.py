"""Hostile safetensors checkpoints fed to `servefleet inspect DIR --json`: the index
(model.safetensors.index.json) of the wrong shape, malformed JSON, shard names and symlinks that
lead out of the checkpoint, a single model.safetensors with a lying header.

Every checkpoint is built small, in a temporary directory, when the case is checked. A refusal
must be exit status 2 with one line naming the file and the problem; nothing outside the
checkpoint directory is stat'ed or opened (servefleet/core/lint/checkpoint.py resolves every name
one component at a time, refusing a symlink that leaves the directory before following it).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from tests.hostile.cases_gguf import cli_refusal, run_cli, scratch
from tests.hostile.table import harmless, refused

CATEGORY = "safetensors indexes"
INDEX = "model.safetensors.index.json"
SHARD = "model-00001-of-00001.safetensors"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
WEIGHT_MAP = {"model.embed_tokens.weight": SHARD, "lm_head.weight": SHARD}


def index_text(weight_map=WEIGHT_MAP, metadata=None, **extra) -> str:
    return json.dumps(
        {"metadata": metadata or {"total_size": 16}, "weight_map": weight_map, **extra}
    )


def build(root: Path, index: str | bytes | None, *, shard: bool = True) -> Path:
    """A checkpoint under root/ckpt: config.json, the index (raw text/bytes), one 24-byte shard;
    root/outside holds a file the checkpoint must never reach."""
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(CONFIG))
    if index is not None:
        (ckpt / INDEX).write_bytes(index.encode() if isinstance(index, str) else index)
    if shard:
        (ckpt / SHARD).write_bytes(bytes(24))
    (root / "outside").mkdir()
    (root / "outside" / "secret.safetensors").write_bytes(b"secret" * 100)
    return ckpt


def with_index(index, prepare=None, **kw):
    """attempt(): inspect a checkpoint holding this index; prepare(root, ckpt) adds to it."""

    def attempt():
        with scratch() as root:
            ckpt = build(root, index, **kw)
            if prepare:
                prepare(root, ckpt)
            return cli_refusal("inspect", ckpt, "--json")

    return attempt


def case(name, expected, index, prepare=None, **kw):
    return refused(CATEGORY, name, expected, with_index(index, prepare, **kw))


def shard_named(name) -> str:
    return index_text({"model.embed_tokens.weight": SHARD, "lm_head.weight": name})


def _symlinked_shard(root: Path, ckpt: Path):
    (ckpt / "evil.safetensors").symlink_to(root / "outside" / "secret.safetensors")


def _symlinked_dir(root: Path, ckpt: Path):
    (ckpt / "sub").symlink_to(root / "outside")


def _relative_symlink(root: Path, ckpt: Path):
    (ckpt / "evil.safetensors").symlink_to("../outside/secret.safetensors")


def _symlink_loop(root: Path, ckpt: Path):
    (ckpt / "a.safetensors").symlink_to("b.safetensors")
    (ckpt / "b.safetensors").symlink_to("a.safetensors")


def _index_symlink_out(root: Path, ckpt: Path):
    (root / "outside" / "index.json").write_text(index_text())
    (ckpt / INDEX).symlink_to(root / "outside" / "index.json")


def _index_fifo(root: Path, ckpt: Path):
    os.mkfifo(ckpt / INDEX)


def _index_sparse_100_mib(root: Path, ckpt: Path):
    with open(ckpt / INDEX, "wb") as f:
        f.truncate(100 << 20)


def single_file(header: bytes, length: int | None = None):
    """A checkpoint with model.safetensors (no index): the 8-byte length, then `header`."""

    def prepare(root: Path, ckpt: Path):
        size = len(header) if length is None else length
        (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", size) + header)

    return prepare


def _hf_cache_layout():
    """A Hugging Face cache snapshot: its files are symlinks into ../../blobs. Followed: the blobs
    are the same repository's."""
    with scratch() as root:
        repo = root / "models--org--name"
        blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
        blobs.mkdir(parents=True)
        snap.mkdir(parents=True)
        for name, content in (
            ("config.json", json.dumps(CONFIG).encode()),
            (INDEX, index_text().encode()),
            (SHARD, bytes(1000)),
        ):
            blob = blobs / f"sha-{name}"
            blob.write_bytes(content)
            (snap / name).symlink_to(Path("../../blobs") / blob.name)
        rc, out, err = run_cli("inspect", snap, "--json")
    assert rc == 0, f"exit {rc}: {err[-800:]}"
    lint = json.loads(out)
    assert (lint["total_bytes"], lint["total_bytes_source"], lint["tensors"]) == (
        1000,
        "shard_files",
        2,
    ), lint


def _extra_keys():
    def lint(index):
        with scratch() as root:
            rc, out, err = run_cli("inspect", build(root, index), "--json")
        assert rc == 0, f"exit {rc}: {err[-800:]}"
        return json.loads(out)

    clean = lint(index_text())
    busy = lint(
        index_text(
            metadata={"total_size": 16, "format": "pt", "extra": [1, {"a": None}]},
            unknown_top_level={"x": [1, 2, 3]},
        )
    )
    assert clean == busy, (clean, busy)
    assert clean["total_bytes"] == 24 and clean["total_bytes_source"] == "shard_files", clean


CASES = [
    case(
        "index is a JSON list",
        "the top level is a JSON array: expected an object",
        json.dumps([WEIGHT_MAP]),
    ),
    case("weight_map is a list", "weight_map is a JSON array", json.dumps({"weight_map": [SHARD]})),
    case("weight_map is missing", "weight_map is missing", json.dumps({"metadata": {}})),
    case("weight_map is empty", "weight_map is empty", index_text({})),
    case("weight_map value is a number", "is a JSON integer: expected a file name", shard_named(7)),
    case(
        "weight_map value is a list", "is a JSON array: expected a file name", shard_named([SHARD])
    ),
    case(
        "shard ../../etc/passwd", "points outside the checkpoint", shard_named("../../etc/passwd")
    ),
    case("shard as an absolute path", "points outside the checkpoint", shard_named("/etc/passwd")),
    case(
        "shard sub/../../x.safetensors",
        "points outside the checkpoint",
        shard_named("sub/../../x.safetensors"),
    ),
    case("shard name with a newline", "is not a plain file name", shard_named("a\nb.safetensors")),
    case(
        "shard that is not a .safetensors file",
        "is not a .safetensors file",
        shard_named("pytorch_model.bin"),
    ),
    case(
        "shard symlink to a file outside",
        "is a symlink leading out of the checkpoint",
        shard_named("evil.safetensors"),
        _symlinked_shard,
    ),
    case(
        "shard relative symlink ../outside",
        "is a symlink leading out of the checkpoint",
        shard_named("evil.safetensors"),
        _relative_symlink,
    ),
    case(
        "shard under a symlinked directory leading out",
        "is a symlink leading out of the checkpoint",
        shard_named("sub/secret.safetensors"),
        _symlinked_dir,
    ),
    case(
        "shard symlink loop",
        "symlinks to follow (a loop)",
        shard_named("a.safetensors"),
        _symlink_loop,
    ),
    case(
        "index symlink leading out",
        "is a symlink leading out of the checkpoint",
        None,
        _index_symlink_out,
    ),
    case(
        "index that is a FIFO (would block a plain open)", "not a regular file", None, _index_fifo
    ),
    case("index of 100 MiB", "larger than the 67108864", None, _index_sparse_100_mib),
    case("index not UTF-8", "not UTF-8 (byte 15)", b'{"weight_map": \xff\xfe}'),
    case("index is not JSON", "invalid JSON at line 1", "{weight_map: nope"),
    case(
        "index nested 100,000 levels deep",
        "nested too deeply",
        '{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ),
    case(
        "total_size NaN",
        "NaN is not a JSON number",
        '{"metadata": {"total_size": NaN}, "weight_map": {"a": "x.safetensors"}}',
    ),
    case(
        "total_size Infinity",
        "Infinity is not a JSON number",
        '{"metadata": {"total_size": Infinity}, "weight_map": {"a": "x.safetensors"}}',
    ),
    case(
        "total_size 1e999",
        "number '1e999' is out of range",
        '{"metadata": {"total_size": 1e999}, "weight_map": {"a": "x.safetensors"}}',
    ),
    case(
        "total_size of 5,000 digits",
        "integer of 5000 digits",
        '{"metadata": {"total_size": ' + "9" * 5000 + '}, "weight_map": {"a": "x.safetensors"}}',
    ),
    case(
        "total_size a string",
        "metadata.total_size = 'many'",
        index_text(metadata={"total_size": "many"}),
        shard=False,
    ),
    case(
        "total_size negative",
        "metadata.total_size = -1",
        index_text(metadata={"total_size": -1}),
        shard=False,
    ),
    case("metadata is a list", "metadata is a JSON array", index_text(metadata=[1])),
    case(
        "duplicate tensor name in weight_map",
        "duplicate key 'lm_head.weight'",
        '{"weight_map": {"lm_head.weight": "a.safetensors", "lm_head.weight": "b.safetensors"}}',
    ),
    case(
        "single file: header length 2**60",
        "safetensors header length 1152921504606846976",
        None,
        single_file(b"{}", length=1 << 60),
    ),
    case(
        "single file: header is a JSON list",
        "header: the top level is a JSON array",
        None,
        single_file(b"[1, 2]"),
    ),
    case(
        "single file: tensor entry is a number",
        "tensor 'x' is a JSON integer",
        None,
        single_file(b'{"x": 1}'),
    ),
    case(
        "single file: 3 bytes",
        "truncated: 3 bytes",
        None,
        lambda root, ckpt: (ckpt / "model.safetensors").write_bytes(b"abc"),
    ),
    harmless(
        CATEGORY,
        "a Hugging Face cache snapshot (symlinks into ../../blobs)",
        "accepted: total_bytes is the blob's size, from shard_files",
        _hf_cache_layout,
    ),
    harmless(
        CATEGORY,
        "unknown keys in the index and its metadata",
        "the lint JSON is identical to the clean index's",
        _extra_keys,
    ),
]
