"""Safetensors checkpoint lint on tiny Qwen3.5-MoE checkpoints with the real tensor naming."""

import hashlib
import json
import shutil

import pytest
from safetensors import safe_open

from servefleet.cli import main
from servefleet.core.lint.checkpoint import (
    MISSING_SHARDS,
    MTP_WITHOUT_TENSORS,
    VISION_WITHOUT_WEIGHTS,
    check_recipe,
    lint_checkpoint,
)
from servefleet_dev.testing.tiny_models import (
    AGENTWORLD_CONFIG,
    build_tiny_checkpoint,
    write_safetensors,
)

SPEC_KEYS = {
    "architecture",
    "tensors",
    "visual_tensors",
    "mtp_tensors",
    "total_bytes",
    "mtp_num_hidden_layers",
    "has_vision_config",
    "findings",
}
MTP_MESSAGE = "config declares MTP but the checkpoint has no MTP tensors: no speculative decoding"
VISION_MESSAGE = (
    "architecture builds a vision tower, checkpoint has no visual weights: "
    "needs language-model-only serving (and the vLLM patch)"
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "full": build_tiny_checkpoint(root / "full"),
        "no_visual": build_tiny_checkpoint(root / "no_visual", visual=False),
        "no_mtp": build_tiny_checkpoint(root / "no_mtp", mtp=False),
        "stripped": build_tiny_checkpoint(root / "stripped", visual=False, mtp=False),
    }


def codes(lint):
    return [f.code for f in lint.findings]


def test_full_checkpoint_counts_come_from_the_index(checkpoints):
    d = checkpoints["full"]
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    lint = lint_checkpoint(d)
    assert lint.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert lint.tensors == len(index["weight_map"])
    assert (
        lint.visual_tensors == sum(n.startswith("model.visual.") for n in index["weight_map"]) > 0
    )
    assert lint.mtp_tensors == sum(n.startswith("mtp.") for n in index["weight_map"]) > 0
    assert len(shards) == 2
    assert lint.total_bytes == sum((d / s).stat().st_size for s in shards)
    assert lint.total_bytes_source == "shard_files"
    assert lint.total_bytes > index["metadata"]["total_size"]  # the headers are on disk too
    assert lint.mtp_num_hidden_layers == 1  # read from text_config
    assert lint.has_vision_config and lint.findings == []
    assert check_recipe(lint, language_model_only=False) == []


def test_stripped_visual_weights_need_language_model_only(checkpoints):
    lint = lint_checkpoint(checkpoints["no_visual"])
    assert lint.visual_tensors == 0 and lint.mtp_tensors > 0
    assert codes(lint) == [VISION_WITHOUT_WEIGHTS]
    assert lint.findings[0].message == VISION_MESSAGE
    errors = check_recipe(lint, language_model_only=False)
    assert len(errors) == 1 and "language-model-only" in errors[0]
    assert check_recipe(lint, language_model_only=True) == []


def test_stripped_mtp_means_no_speculative_decoding(checkpoints):
    lint = lint_checkpoint(checkpoints["no_mtp"])
    assert lint.mtp_tensors == 0 and lint.visual_tensors > 0
    assert codes(lint) == [MTP_WITHOUT_TENSORS]
    assert lint.findings[0].message == MTP_MESSAGE
    assert check_recipe(lint, language_model_only=False) == []
    assert check_recipe(lint, language_model_only=False, mtp_speculative=True) != []


def test_stripped_checkpoint_reports_both(checkpoints):
    lint = lint_checkpoint(checkpoints["stripped"])
    assert set(codes(lint)) == {MTP_WITHOUT_TENSORS, VISION_WITHOUT_WEIGHTS}
    assert check_recipe(lint, language_model_only=True) == []


def test_causal_lm_class_builds_no_vision_tower(tmp_path, checkpoints):
    d = shutil.copytree(checkpoints["stripped"], tmp_path / "causal")
    config = json.loads((d / "config.json").read_text())
    config["architectures"] = ["Qwen3_5MoeForCausalLM"]
    (d / "config.json").write_text(json.dumps(config))
    lint = lint_checkpoint(d)
    assert lint.has_vision_config and not lint.builds_vision_tower
    assert codes(lint) == [MTP_WITHOUT_TENSORS]
    assert check_recipe(lint, language_model_only=False) == []


def test_missing_shards_fall_back_to_index_total_size(tmp_path, checkpoints):
    d = tmp_path / "partial"
    d.mkdir()
    for name in ("config.json", "model.safetensors.index.json"):  # metadata only, no weights yet
        shutil.copy(checkpoints["full"] / name, d)
    lint = lint_checkpoint(d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert lint.total_bytes == index["metadata"]["total_size"]
    assert lint.total_bytes_source == "index_metadata"
    assert MISSING_SHARDS in codes(lint)
    assert lint.tensors == lint_checkpoint(checkpoints["full"]).tensors


def test_single_file_checkpoint_without_index(tmp_path, checkpoints):
    d = tmp_path / "single"
    d.mkdir()
    shutil.copy(checkpoints["full"] / "config.json", d)
    shapes = {
        "model.language_model.embed_tokens.weight": (4, 2),
        "model.visual.pos_embed.weight": (2, 2),
    }
    write_safetensors(
        d / "model.safetensors", {n: bytes(2 * a * b) for n, (a, b) in shapes.items()}, shapes
    )
    lint = lint_checkpoint(d)
    assert (lint.tensors, lint.visual_tensors, lint.mtp_tensors) == (2, 1, 0)
    assert lint.total_bytes == (d / "model.safetensors").stat().st_size


def test_tensor_names_and_shapes_follow_qwen3_5_moe(checkpoints):
    d = checkpoints["full"]
    config = json.loads((d / "config.json").read_text())
    t = config["text_config"]
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]

    def shape(name):
        with safe_open(d / index[name], framework="numpy") as f:
            s = f.get_slice(name)
            assert s.get_dtype() == "BF16"
            return s.get_shape()

    h, e = t["hidden_size"], t["num_experts"]
    assert t["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    qkv = (
        2 * t["linear_num_key_heads"] * t["linear_key_head_dim"]
        + t["linear_num_value_heads"] * t["linear_value_head_dim"]
    )
    assert shape("model.language_model.layers.0.linear_attn.in_proj_qkv.weight") == [qkv, h]
    assert shape("model.language_model.layers.0.linear_attn.conv1d.weight") == [qkv, 1, 4]
    assert shape("model.language_model.layers.3.self_attn.q_proj.weight") == [
        t["num_attention_heads"] * t["head_dim"] * 2,
        h,
    ]
    assert shape("model.language_model.layers.3.mlp.experts.gate_up_proj") == [
        e,
        2 * t["moe_intermediate_size"],
        h,
    ]
    assert shape("model.language_model.layers.3.mlp.experts.down_proj") == [
        e,
        h,
        t["moe_intermediate_size"],
    ]
    assert shape("mtp.fc.weight") == [h, 2 * h]
    assert shape("mtp.layers.0.mlp.experts.3.down_proj.weight") == [h, t["moe_intermediate_size"]]
    assert shape("model.visual.merger.linear_fc2.weight")[0] == h
    assert "lm_head.weight" in index and "model.language_model.embed_tokens.weight" in index
    assert "model.language_model.layers.0.self_attn.q_proj.weight" not in index  # linear layer


def test_tiny_config_keeps_agentworld_fields(checkpoints):
    config = json.loads((checkpoints["full"] / "config.json").read_text())
    assert config["architectures"] == AGENTWORLD_CONFIG["architectures"]
    assert set(AGENTWORLD_CONFIG["text_config"]) <= set(config["text_config"])
    assert config["text_config"]["mtp_num_hidden_layers"] == 1 and "vision_config" in config
    assert sum(config["text_config"]["rope_parameters"]["mrope_section"]) == 16


def test_builds_are_deterministic(tmp_path, checkpoints):
    again = build_tiny_checkpoint(tmp_path / "again")

    def digest(d):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}

    assert digest(again) == digest(checkpoints["full"])


def test_inspect_json_prints_the_spec_keys(checkpoints, capsys):
    assert main(["inspect", str(checkpoints["stripped"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert SPEC_KEYS <= set(out)
    assert {f["code"] for f in out["findings"]} == {MTP_WITHOUT_TENSORS, VISION_WITHOUT_WEIGHTS}
    assert {f["message"] for f in out["findings"]} == {MTP_MESSAGE, VISION_MESSAGE}
    assert main(["inspect", str(checkpoints["stripped"]), "--strict"]) == 1
    assert VISION_MESSAGE in capsys.readouterr().out.replace("\n", " ")
    assert main(["inspect", str(checkpoints["full"]), "--strict"]) == 0
