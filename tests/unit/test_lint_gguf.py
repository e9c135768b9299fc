"""GGUF lint: block_count versus the blk.N tensors, and the --override-kv that fixes a mismatch."""

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from servefleet.cli import main
from servefleet.core.lint import gguf_lint as _gguf_lint_module
from servefleet.core.lint.gguf_lint import (
    BLOCKS_NOT_COUNTED,
    UNCOUNTED_BLOCKS_MISSING,
    lint_gguf,
    override_kv_flag,
)
from servefleet_dev.testing.tiny_models import (
    GGUF_CLEAN,
    GGUF_FIELD_MISSING_MTP,
    GGUF_MISSING_MTP,
    GGUF_MTP,
    GGUF_UNCOUNTED,
    build_tiny_gguf,
)

# The file the llama.cpp recipe uploads to a node (servefleet/engines/llamacpp/steps.py LINT_SOURCE).
GGUF_LINT_SCRIPT = Path(_gguf_lint_module.__file__)
GGUF_HEADER_SCRIPT = GGUF_LINT_SCRIPT.with_name("gguf_header.py")


def node_copy(tmp_path) -> Path:
    """The two files as the recipe uploads them to bin/ (the lint imports its sibling)."""
    shutil.copy(GGUF_HEADER_SCRIPT, tmp_path / "gguf_header.py")
    return Path(shutil.copy(GGUF_LINT_SCRIPT, tmp_path / "servefleet-gguf-lint"))


FIELD_FLAG = "qwen35moe.block_count=int:40,qwen35moe.nextn_predict_layers=int:0"
SPEC_KEYS = {
    "arch",
    "block_count",
    "highest_block",
    "nextn_predict_layers",
    "defect",
    "override_kv",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The four tiny qwen35moe layouts, built once."""
    root = tmp_path_factory.mktemp("gguf")
    return {
        layout: build_tiny_gguf(root / f"{layout}.gguf", layout=layout)
        for layout in (GGUF_CLEAN, GGUF_MTP, GGUF_MISSING_MTP, GGUF_UNCOUNTED)
    }


def write_gguf(
    path, arch, block_count, blocks, nextn=None, extra_tensors=("token_embd.weight",), **writer_kw
):
    """A minimal GGUF of any architecture: the keys the lint reads and one tensor per block."""
    w = gguf.GGUFWriter(path, arch, **writer_kw)
    w.add_block_count(block_count)
    if nextn is not None:
        w.add_nextn_predict_layers(nextn)
    for name in extra_tensors:
        w.add_tensor(name, np.zeros((2, 4), np.float32))
    for b in blocks:
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_missing_mtp_block_is_the_defect_and_both_keys_are_overridden(tiny):
    lint = lint_gguf(tiny[GGUF_MISSING_MTP])
    assert (lint.arch, lint.block_count, lint.highest_block, lint.nextn_predict_layers) == (
        "qwen35moe",
        5,
        3,
        1,
    )
    assert lint.defect == UNCOUNTED_BLOCKS_MISSING
    assert lint.override_kv == [
        "qwen35moe.block_count=int:4",
        "qwen35moe.nextn_predict_layers=int:0",
    ]
    assert (
        override_kv_flag(lint) == "qwen35moe.block_count=int:4,qwen35moe.nextn_predict_layers=int:0"
    )


def test_clean_and_real_mtp_files_have_no_defect(tiny):
    clean = lint_gguf(tiny[GGUF_CLEAN])
    assert (clean.block_count, clean.highest_block, clean.nextn_predict_layers, clean.defect) == (
        4,
        3,
        None,
        None,
    )
    assert clean.override_kv == [] and override_kv_flag(clean) is None
    mtp = lint_gguf(tiny[GGUF_MTP])  # blk.4 holds the NextN block: counted and present
    assert (mtp.block_count, mtp.highest_block, mtp.nextn_predict_layers, mtp.defect) == (
        5,
        4,
        1,
        None,
    )


def test_blocks_not_counted_gets_only_the_block_count_override(tiny):
    lint = lint_gguf(tiny[GGUF_UNCOUNTED])
    assert (lint.block_count, lint.highest_block, lint.defect) == (3, 3, BLOCKS_NOT_COUNTED)
    assert lint.override_kv == ["qwen35moe.block_count=int:4"]


@pytest.mark.parametrize("arch", ["llama", "deepseek2", "glm4moe", "qwen3next"])
def test_overrides_are_derived_for_any_architecture(tmp_path, arch):
    with_key = lint_gguf(
        write_gguf(tmp_path / "a.gguf", arch, block_count=48, blocks=range(47), nextn=1)
    )
    assert with_key.defect == UNCOUNTED_BLOCKS_MISSING
    assert with_key.override_kv == [
        f"{arch}.block_count=int:47",
        f"{arch}.nextn_predict_layers=int:0",
    ]
    # No nextn key in the file: nothing to override but block_count.
    without_key = lint_gguf(write_gguf(tmp_path / "b.gguf", arch, block_count=3, blocks=range(2)))
    assert without_key.nextn_predict_layers is None
    assert without_key.override_kv == [f"{arch}.block_count=int:2"]


def test_file_without_block_tensors_is_not_judged(tmp_path):
    lint = lint_gguf(write_gguf(tmp_path / "vocab.gguf", "llama", block_count=32, blocks=[]))
    assert lint.highest_block is None and lint.defect is None and lint.override_kv == []


def test_split_gguf_is_judged_over_all_shards(tmp_path):
    # 2 tensors per shard: blk.0 and blk.1 end up in different files.
    write_gguf(
        tmp_path / "m.gguf", "qwen35moe", block_count=3, blocks=range(3), split_max_tensors=2
    )
    first, second = sorted(tmp_path.glob("m-*.gguf"))
    assert first.name == "m-00001-of-00002.gguf"
    for shard in (first, second):  # either shard names the same split
        lint = lint_gguf(shard)
        assert (lint.block_count, lint.highest_block, lint.defect) == (3, 2, None)


def test_inspect_json_prints_the_spec_keys(tiny, capsys):
    assert main(["inspect", str(tiny[GGUF_MISSING_MTP]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == SPEC_KEYS
    assert out["defect"] == "uncounted_blocks_missing"
    assert all(" " not in kv for kv in out["override_kv"])
    assert main(["inspect", str(tiny[GGUF_CLEAN]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["defect"] is None


def test_inspect_human_output_shows_the_fix_and_strict_fails(tiny, capsys):
    assert main(["inspect", str(tiny[GGUF_MISSING_MTP])]) == 0
    out = capsys.readouterr().out
    assert "blk.4.attn_norm.weight" in out
    assert "--override-kv qwen35moe.block_count=int:4,qwen35moe.nextn_predict_layers=int:0" in out
    assert main(["inspect", str(tiny[GGUF_MISSING_MTP]), "--strict"]) == 1
    assert main(["inspect", str(tiny[GGUF_CLEAN]), "--strict"]) == 0


def test_inspect_rejects_a_file_that_is_not_gguf(tmp_path, capsys):
    (tmp_path / "x.bin").write_bytes(b"not a model")
    assert main(["inspect", str(tmp_path / "x.bin")]) == 2
    assert "not a GGUF" in capsys.readouterr().err


def test_standalone_script_needs_only_gguf_and_stdlib(tiny, tmp_path):
    """What a node runs: a copy of the module, with servefleet not importable."""
    script = node_copy(tmp_path)
    blocker = (
        "import sys, runpy; sys.modules['servefleet'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )

    def run(*args):
        return subprocess.run(
            [sys.executable, "-I", "-c", blocker, str(script), *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    out = json.loads(run(str(tiny[GGUF_MISSING_MTP])))
    assert out == lint_gguf(tiny[GGUF_MISSING_MTP]).to_dict()
    assert (
        run("--flag", str(tiny[GGUF_MISSING_MTP])).strip()
        == "qwen35moe.block_count=int:4,qwen35moe.nextn_predict_layers=int:0"
    )
    assert run("--flag", str(tiny[GGUF_CLEAN])).strip() == ""


def test_tiny_gguf_uses_the_real_qwen35moe_tensor_names(tiny):
    reader = gguf.GGUFReader(tiny[GGUF_MTP])
    names = {t.name for t in reader.tensors}
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN35MOE]}
    known |= {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSOR if t.name.startswith("NEXTN_")}
    templates = {n.split(".", 2)[-1] if n.startswith("blk.") else n for n in known}
    for name in names:  # every tensor is one gguf knows for qwen35moe (+ the NextN block)
        stem = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
        stem = stem.split(".", 2)[-1] if stem.startswith("blk.") else stem
        assert stem in templates, name
    # linear-attention blocks 0-2, full attention at 3 (every 4th), NextN block at 4
    assert "blk.0.ssm_conv1d.weight" in names and "blk.0.attn_q.weight" not in names
    assert "blk.3.attn_q.weight" in names and "blk.3.ssm_a" not in names
    assert "blk.4.nextn.eh_proj.weight" in names


def test_tiny_gguf_is_deterministic(tmp_path):
    a = build_tiny_gguf(tmp_path / "a.gguf", layout=GGUF_MISSING_MTP)
    b = build_tiny_gguf(tmp_path / "b.gguf", layout=GGUF_MISSING_MTP)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


def test_lint_reads_headers_only_even_on_a_20_gib_file(tmp_path):
    """A sparse 20 GiB GGUF (the size of the real quantized model): linted without reading its data."""
    path = tmp_path / "big.gguf"
    per_block = (20 << 30) // 40
    w = gguf.GGUFWriter(path, "qwen35moe")
    w.add_block_count(41)
    w.add_nextn_predict_layers(1)
    for b in range(40):
        w.add_tensor_info(
            f"blk.{b}.ffn_down_exps.weight", (per_block // 2,), np.dtype(np.float16), per_block
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    with open(path, "r+b") as f:  # tensor data as a hole: 20 GiB apparent, nothing on disk
        f.truncate(header + (-header % 32) + 40 * per_block)
    assert path.stat().st_size >= 20 << 30
    started = time.monotonic()
    lint = lint_gguf(path)
    assert time.monotonic() - started < 5
    assert lint.override_kv == [
        "qwen35moe.block_count=int:40",
        "qwen35moe.nextn_predict_layers=int:0",
    ]


# --- the field file's layout ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    return build_tiny_gguf(
        tmp_path_factory.mktemp("field") / "field.gguf", layout=GGUF_FIELD_MISSING_MTP
    )


def _blocks(names) -> dict[int, set[str]]:
    """Block index -> the tensor names of that block without the blk.N. prefix."""
    out: dict[int, set[str]] = {}
    for name in names:
        if name.startswith("blk."):
            _, b, rest = name.split(".", 2)
            out.setdefault(int(b), set()).add(rest)
    return out


def test_field_gguf_counts_41_blocks_and_holds_40(field):
    reader = gguf.GGUFReader(field)
    assert reader.get_field("general.architecture").contents() == "qwen35moe"
    assert reader.get_field("qwen35moe.block_count").contents() == 41
    assert reader.get_field("qwen35moe.nextn_predict_layers").contents() == 1
    assert reader.get_field("qwen35moe.full_attention_interval").contents() == 4
    names = [t.name for t in reader.tensors]
    blocks = _blocks(names)
    assert sorted(blocks) == list(range(40))  # blk.0-39, no blk.40 (the counted MTP block)
    assert not any(".nextn." in n for n in names)
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= set(names)
    # Every 4th block full attention, the rest recurrent (gated delta net), as the real model.
    full = {b for b, t in blocks.items() if "attn_q.weight" in t}
    recurrent = {b for b, t in blocks.items() if "ssm_conv1d.weight" in t}
    assert full == set(range(3, 40, 4)) and recurrent == set(range(40)) - full


def test_field_gguf_uses_the_same_block_layout_as_the_small_files(field, tiny):
    small = _blocks(t.name for t in gguf.GGUFReader(tiny[GGUF_MISSING_MTP]).tensors)
    big = _blocks(t.name for t in gguf.GGUFReader(field).tensors)
    assert big[0] == small[0] and big[3] == small[3]  # recurrent / full attention blocks
    assert all(big[b] == small[b % 4] for b in big)  # the 4-block pattern, repeated


def test_field_gguf_is_small_and_deterministic(field, tmp_path):
    assert 1 << 20 < field.stat().st_size < 32 << 20  # ~8 MB
    again = build_tiny_gguf(tmp_path / "again.gguf", layout=GGUF_FIELD_MISSING_MTP)
    assert (
        hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(field.read_bytes()).digest()
    )
    with pytest.raises(ValueError, match="40 blocks"):
        build_tiny_gguf(tmp_path / "x.gguf", layout=GGUF_FIELD_MISSING_MTP, n_layers=4)


def test_field_gguf_lint_gives_the_field_flag(field, tmp_path):
    lint = lint_gguf(field)
    assert (lint.arch, lint.block_count, lint.highest_block, lint.nextn_predict_layers) == (
        "qwen35moe",
        41,
        39,
        1,
    )
    assert lint.defect == UNCOUNTED_BLOCKS_MISSING
    assert override_kv_flag(lint) == FIELD_FLAG
    # The copy a node runs says the same.
    script = node_copy(tmp_path)
    out = subprocess.run(
        [sys.executable, "-I", str(script), "--flag", str(field)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == FIELD_FLAG
