"""Hostile config.json files fed to `servefleet plan-kv --config F` (and a few to
`servefleet inspect DIR`, which reads the checkpoint's config.json).

Every field plan-kv reads must be a positive integer (bool is not one) where vLLM needs one, a
known dtype, a list of layer type names; the file itself strict JSON (UTF-8, one object, no
duplicate keys, no NaN/Infinity, bounded size and nesting). A refusal is exit status 2 with one
line naming the file, the key and the value. Files are built in a temporary directory at check
time.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from tests.hostile.cases_gguf import cli_refusal, run_cli, scratch
from tests.hostile.table import harmless, refused

CATEGORY = "config.json"

# Qwen-AgentWorld-35B-A3B's config.json, the fields plan-kv reads (tests/fixtures has the file).
CLEAN = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "dtype": "bfloat16",
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "full_attention_interval": 4,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "dtype": "bfloat16",
    },
}
PLAN = ("--max-model-len", "262144", "--kv-cache-memory-bytes", "8GiB")


def plan_kv_output(path: Path, *extra) -> tuple[int, str, str]:
    return run_cli("plan-kv", "--config", path, *PLAN, *extra)


def plan_text(text: str | bytes, *, sparse_to: int = 0):
    """attempt(): plan-kv on a config.json holding exactly this text."""

    def attempt():
        with scratch() as tmp:
            path = tmp / "config.json"
            path.write_bytes(text.encode() if isinstance(text, str) else text)
            if sparse_to:
                with open(path, "r+b") as f:
                    f.truncate(sparse_to)
            return cli_refusal("plan-kv", "--config", path, *PLAN)

    return attempt


def edited(edit) -> str:
    """The clean config after edit(config, text_config) changed it, as JSON text."""
    config = copy.deepcopy(CLEAN)
    edit(config, config["text_config"])
    return json.dumps(config)


def text_key(key, value):
    def edit(config, text):
        if value is _DELETE:
            del text[key]
        else:
            text[key] = value

    return edit


_DELETE = object()


def case(name, expected, edit_or_text):
    text = edit_or_text if isinstance(edit_or_text, (str, bytes)) else edited(edit_or_text)
    return refused(CATEGORY, name, expected, plan_text(text))


def _without_layer_types(**fields):
    def edit(config, text):
        del text["layer_types"]
        text.update(fields)

    return edit


def _fifo():
    with scratch() as tmp:
        os.mkfifo(tmp / "config.json")
        return cli_refusal("plan-kv", "--config", tmp / "config.json", *PLAN)


def inspect_config(config_text: str, prepare=None):
    """attempt(): `servefleet inspect DIR` on a checkpoint holding this config.json and a valid
    one-shard index."""

    def attempt():
        with scratch() as tmp:
            ckpt = tmp / "ckpt"
            ckpt.mkdir()
            (ckpt / "config.json").write_text(config_text)
            (ckpt / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"lm_head.weight": "model.safetensors"}})
            )
            (ckpt / "model.safetensors").write_bytes(bytes(16))
            if prepare:
                prepare(tmp, ckpt)
            return cli_refusal("inspect", ckpt)

    return attempt


def _config_symlink_out(tmp: Path, ckpt: Path):
    (tmp / "elsewhere.json").write_text(json.dumps(CLEAN))
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").symlink_to(tmp / "elsewhere.json")


def _same_as_clean(text: str, *, clean: str | None = None):
    """plan-kv on `text` prints exactly what it prints for `clean` (default: the clean config)."""

    def check():
        with scratch() as tmp:
            a, b = tmp / "clean.json", tmp / "other.json"
            a.write_text(clean if clean is not None else json.dumps(CLEAN))
            b.write_text(text)
            for extra in ((), ("--json",)):
                ra, rb = plan_kv_output(a, *extra), plan_kv_output(b, *extra)
                assert ra[0] in (0, 1) and rb == ra, f"clean: {ra}\nother: {rb}"

    return check


def _unknown_keys(config, text):
    config["quantization_config"] = {"quant_method": "fp8", "weird": [1, {"x": None}]}
    config["auto_map"] = {"AutoModel": "modeling.Foo"}
    text["some_future_field"] = -1
    text["rope_parameters"] = {"mrope_section": [11, 11, 10], "rope_theta": 1e7}


def _null_head_dim(config, text):
    text["head_dim"] = None  # vLLM's get_head_size falls back to hidden_size // num_attention_heads


def _explicit_head_dim(config, text):
    text["head_dim"] = text["hidden_size"] // text["num_attention_heads"]


CASES = [
    case(
        "num_key_value_heads 0",
        "text_config.num_key_value_heads = 0: expected a positive integer",
        text_key("num_key_value_heads", 0),
    ),
    case(
        "negative head_dim",
        "text_config.head_dim = -256: expected a positive integer",
        text_key("head_dim", -256),
    ),
    case(
        "num_key_value_heads true (a bool)",
        "text_config.num_key_value_heads = True",
        text_key("num_key_value_heads", True),
    ),
    case(
        "num_hidden_layers as a string",
        "text_config.num_hidden_layers = '40'",
        text_key("num_hidden_layers", "40"),
    ),
    case("head_dim as a float", "text_config.head_dim = 256.0", text_key("head_dim", 256.0)),
    case(
        "head_dim of 2**40", "text_config.head_dim = 1099511627776", text_key("head_dim", 1 << 40)
    ),
    case(
        "linear_num_value_heads -1",
        "text_config.linear_num_value_heads = -1",
        text_key("linear_num_value_heads", -1),
    ),
    case(
        "linear_conv_kernel_dim missing",
        "config lacks linear_conv_kernel_dim",
        text_key("linear_conv_kernel_dim", _DELETE),
    ),
    case(
        "num_hidden_layers of 10**12 without layer_types (no 10**12-entry list)",
        "text_config.num_hidden_layers = 1000000000000: expected a positive integer of at most",
        _without_layer_types(num_hidden_layers=10**12),
    ),
    case(
        "full_attention_interval 0",
        "text_config.full_attention_interval = 0",
        _without_layer_types(full_attention_interval=0),
    ),
    case(
        "full_attention_interval null",
        "text_config.full_attention_interval = None",
        _without_layer_types(full_attention_interval=None),
    ),
    case(
        "layer_types a string",
        "text_config.layer_types = 'full_attention'",
        text_key("layer_types", "full_attention"),
    ),
    case(
        "layer_types holding an object",
        "text_config.layer_types = a list of 40",
        text_key("layer_types", (["linear_attention"] * 3 + [{"x": 1}]) * 10),
    ),
    case(
        "layer_types shorter than num_hidden_layers",
        "text_config.layer_types names 4 layers: fewer than num_hidden_layers = 40",
        text_key("layer_types", ["linear_attention"] * 3 + ["full_attention"]),
    ),
    case(
        "layer_types naming an unknown type",
        "text_config.layer_types holds unsupported layer types: 'sliding_window'",
        text_key("layer_types", (["sliding_window"] * 3 + ["full_attention"]) * 10),
    ),
    case(
        "hidden_size smaller than num_attention_heads, no head_dim",
        "gives head_dim 0",
        lambda c, t: t.update(head_dim=None, hidden_size=8),
    ),
    case(
        "num_key_value_heads null (vLLM fails on it)",
        "text_config.num_key_value_heads = None: expected a positive integer",
        text_key("num_key_value_heads", None),
    ),
    case(
        "num_key_value_heads missing (vLLM's config class would default it)",
        "config lacks num_key_value_heads",
        text_key("num_key_value_heads", _DELETE),
    ),
    case(
        "text_config is a list", "text_config = a list of 1", lambda c, t: c.update(text_config=[t])
    ),
    case(
        "dtype is a list",
        "dtype = a list of 1: expected a dtype name",
        lambda c, t: c.update(dtype=["bfloat16"]),
    ),
    case(
        "mamba_ssm_dtype float8",
        "text_config.mamba_ssm_dtype = 'float8': unsupported dtype",
        text_key("mamba_ssm_dtype", "float8"),
    ),
    case(
        "architectures a string",
        "architectures = 'Qwen3_5MoeForConditionalGeneration'",
        lambda c, t: c.update(architectures="Qwen3_5MoeForConditionalGeneration"),
    ),
    case(
        "top level is a list",
        "the top level is a JSON array: expected an object",
        json.dumps([CLEAN]),
    ),
    case(
        "NaN value",
        "NaN is not a JSON number",
        edited(text_key("head_dim", 0)).replace('"head_dim": 0', '"head_dim": NaN'),
    ),
    case(
        "-Infinity value",
        "-Infinity is not a JSON number",
        edited(text_key("head_dim", 0)).replace('"head_dim": 0', '"head_dim": -Infinity'),
    ),
    case(
        "integer of 5,000 digits",
        "integer of 5000 digits",
        edited(text_key("head_dim", 0)).replace('"head_dim": 0', '"head_dim": ' + "9" * 5000),
    ),
    case(
        "duplicate key head_dim",
        "duplicate key 'head_dim'",
        edited(text_key("head_dim", 0)).replace('"head_dim": 0', '"head_dim": 256, "head_dim": 8'),
    ),
    case("not UTF-8", "not UTF-8 (byte 1)", b"{\xff}"),
    case("not JSON (a YAML-ish file)", "invalid JSON at line 1 column 1", "head_dim: 256\n"),
    case("nested 100,000 levels deep", "nested too deeply", "[" * 100_000 + "]" * 100_000),
    case("empty file", "invalid JSON at line 1 column 1", ""),
    refused(
        CATEGORY,
        "config.json of 10 MiB",
        "larger than the 4194304",
        plan_text("{}", sparse_to=10 << 20),
    ),
    refused(
        CATEGORY,
        "config.json that is a FIFO (would block a plain open)",
        "not a regular file",
        _fifo,
    ),
    refused(
        CATEGORY,
        "inspect: architectures entry with rich markup",
        "architectures holds '[/red]'",
        inspect_config(json.dumps({"architectures": ["[/red]"]})),
    ),
    refused(
        CATEGORY,
        "inspect: text_config a list",
        "text_config = array of 1: expected an object",
        inspect_config(json.dumps({"text_config": [1]})),
    ),
    refused(
        CATEGORY,
        "inspect: mtp_num_hidden_layers a string",
        "mtp_num_hidden_layers = '1'",
        inspect_config(json.dumps({"text_config": {"mtp_num_hidden_layers": "1"}})),
    ),
    refused(
        CATEGORY,
        "inspect: config.json symlink leading out",
        "'config.json' is a symlink leading out of the checkpoint",
        inspect_config("{}", _config_symlink_out),
    ),
    harmless(
        CATEGORY,
        "unknown keys, nested objects and negative numbers in fields plan-kv does not read",
        "plan-kv's output (human and --json) is identical to the clean config's",
        _same_as_clean(edited(_unknown_keys)),
    ),
    harmless(
        CATEGORY,
        "head_dim null (vLLM falls back to hidden_size // num_attention_heads)",
        "plan-kv's output is identical to head_dim = hidden_size // num_attention_heads",
        _same_as_clean(edited(_null_head_dim), clean=edited(_explicit_head_dim)),
    ),
    harmless(
        CATEGORY,
        "keys reordered and reindented",
        "plan-kv's output is identical to the clean config's",
        _same_as_clean(json.dumps(dict(reversed(list(CLEAN.items()))), indent="\t")),
    ),
]
