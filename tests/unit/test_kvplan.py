"""plan-kv reproduces vLLM 0.24.0's KV-cache sizing for hybrid models.

Expected values are worked out by hand from vLLM's code (see servefleet/engines/vllm/logic/kvplan.py for the
functions); each test shows its arithmetic. Shorthand: GiB = 2**30; cdiv = ceiling division.

The published model (agentworld-config.json), used as the base of most tests:
  full attention per token:   2 KV heads * (256 + 256) * 2 B (bf16)            = 2,048 B
  gated-delta-net state:      conv_dim = 128*16*2 + 128*32                     = 8,192
                              conv  (8,192 x (4-1)) * 2 B (bf16)               = 49,152 B
                              ssm   32 x 128 x 128 * 4 B (mamba_ssm_dtype fp32) = 2,097,152 B
                              total                                            = 2,146,304 B
  block size:                 16 * cdiv(2,146,304, 16 * 2,048) = 16 * 66       = 1,056 tokens
  page (one block, one layer): 1,056 * 2,048                                   = 2,162,688 B
  layers: 10 full + 30 linear; group_size = min = 10 (30 >= 1.5 * 10)
          -> 1 full-attention group + 3 linear-attention groups of 10 layers
  bytes per block:            10 * 2,162,688                                   = 21,626,880 B
"""

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet import cli
from servefleet.engines.vllm.logic.kvplan import GiB, format_gib, load_config, plan_kv

# Qwen-AgentWorld-35B-A3B's config.json, the fields vLLM's KV sizing reads (the full file is
# tests/fixtures/agentworld-config.json).
AGENTWORLD = {
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
# The model's config.json as vLLM reads it (a copy of ../shared/agentworld-config.json).
SHARED_CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "agentworld-config.json"
BYTES_PER_BLOCK = 21_626_880


@pytest.fixture
def config():
    return copy.deepcopy(AGENTWORLD)


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(AGENTWORLD))
    return path


def test_shared_config_file_gives_same_plan(config):
    assert plan_kv(load_config(SHARED_CONFIG), 262_144, 8 * GiB) == plan_kv(
        config, 262_144, 8 * GiB
    )


def text_config(config, **changes):
    """A copy of the published config with text_config fields changed."""
    c = copy.deepcopy(config)
    c["text_config"].update(changes)
    return c


# --- the published numbers -------------------------------------------------------------------


def test_published_8gib_pool(config):
    # num_blocks = 8,589,934,592 // 2,162,688 // 10 = 3,971 // 10 = 397
    # per request = cdiv(262,144, 1,056) full blocks + 1 block per linear group = 249 + 3 = 252
    # concurrency = 397 / 252 = 1.5754 -> "1.58x"; tokens = int(1.5754 * 262,144) = 412,980
    plan = plan_kv(config, 262_144, 8 * GiB)
    assert plan.block_size == 1056
    assert plan.bytes_per_block == BYTES_PER_BLOCK
    assert plan.num_blocks == 397
    assert plan.tokens == 412_980
    assert f"{plan.max_concurrency:.2f}" == "1.58"
    assert plan.max_concurrency == 397 / 252  # unrounded
    assert plan.fits


def test_published_4gib_pool_refused(config):
    # needed = 10 layers * 2,162,688 B * 252 blocks = 5,449,973,760 B = 5.0757 GiB -> "5.08"
    plan = plan_kv(config, 262_144, 4 * GiB)
    assert not plan.fits
    assert plan.needed_bytes == 5_449_973_760
    assert format_gib(plan.needed_bytes) == "5.08"
    # 4 GiB // 2,162,688 // 10 = 198 blocks; vLLM's hint: the longest request that fits is
    # the largest L with 10 * 2,162,688 * (cdiv(L, 1056) + 3) <= 4 GiB -> 195 full blocks
    # -> L = 195 * 1,056 = 205,920
    assert plan.num_blocks == 198
    assert plan.estimated_max_model_len == 205_920


# --- other lengths, pools, configs -----------------------------------------------------------


def test_shorter_max_model_len(config):
    # cdiv(131,072, 1,056) = 125 -> 128 blocks per request; 397 / 128 = 3.1015625
    # tokens = 3.1015625 * 131,072 = 406,528; needed = 21,626,880 * 128 = 2,768,240,640
    plan = plan_kv(config, 131_072, 8 * GiB)
    assert plan.blocks_per_request == 128
    assert plan.max_concurrency == 3.1015625
    assert plan.tokens == 406_528
    assert plan.needed_bytes == 2_768_240_640


def test_exact_pool_boundary(config):
    # L = 1,056 -> 1 full block + 3 state blocks = 4 blocks; needed = 10 * 2,162,688 * 4 = 86,507,520
    assert plan_kv(config, 1056, 86_507_520).fits
    short = plan_kv(config, 1056, 86_507_520 - 1)
    assert not short.fits
    assert short.estimated_max_model_len == 0  # even 1 token needs the 4 blocks


def test_bfloat16_ssm_state(config):
    # ssm 32 x 128 x 128 * 2 B = 1,048,576 B; + conv 49,152 = 1,097,728 B
    # block = 16 * cdiv(1,097,728, 32,768) = 16 * 34 = 544; page = 544 * 2,048 = 1,114,112
    # num_blocks = 8 GiB // 1,114,112 // 10 = 7,710 // 10 = 771
    # per request = cdiv(262,144, 544) + 3 = 482 + 3 = 485; 771 / 485 = 1.5897
    # tokens = int(1.5897 * 262,144) = 416,727
    plan = plan_kv(text_config(config, mamba_ssm_dtype="bfloat16"), 262_144, 8 * GiB)
    assert (plan.block_size, plan.bytes_per_block, plan.num_blocks) == (544, 11_141_120, 771)
    assert plan.tokens == 416_727
    assert f"{plan.max_concurrency:.2f}" == "1.59"
    # --mamba-ssm-cache-dtype overrides the config, as vLLM's flag does
    assert plan_kv(config, 262_144, 8 * GiB, mamba_ssm_cache_dtype="bfloat16") == plan


def test_flat_config_without_text_config(config):
    # The same fields at the top level give the same plan (hf_text_config is the config itself).
    flat = dict(config["text_config"], architectures=config["architectures"])
    assert plan_kv(flat, 262_144, 8 * GiB) == plan_kv(config, 262_144, 8 * GiB)


def test_qwen3_next_flat_config():
    # Qwen3-Next-80B-A3B style: flat, 48 layers, full attention every 4th -> 12 full + 36 linear;
    # no mamba_ssm_dtype, so the state is bf16: block 544, page 1,114,112 (as above).
    # group_size 12 -> 1 + 3 groups; bytes per block = 12 * 1,114,112 = 13,369,344
    # num_blocks = 7,710 // 12 = 642; per request = 482 + 3 = 485; 642 / 485 = 1.3237
    # tokens = int(1.3237 * 262,144) = 347,002
    cfg = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_size": 2048,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "dtype": "bfloat16",
    }
    plan = plan_kv(cfg, 262_144, 8 * GiB)
    assert (plan.block_size, plan.group_size, plan.full_groups, plan.mamba_groups) == (
        544,
        12,
        1,
        3,
    )
    assert plan.bytes_per_block == 13_369_344
    assert plan.num_blocks == 642
    assert plan.tokens == 347_002
    # vLLM only copies mamba_ssm_dtype into the cache config for the Qwen3.5 architectures
    # (Qwen3_5ForConditionalGenerationConfig); for Qwen3-Next the field changes nothing.
    assert plan_kv(dict(cfg, mamba_ssm_dtype="float32"), 262_144, 8 * GiB) == plan


def test_uneven_layer_counts_are_padded(config):
    # 35 layers: 10 full + 25 linear.
    # group_size = 10; linear groups = cdiv(25, 10) = 3 (sizes 9, 8, 8) -> 5 padding layers.
    # Padding costs memory: blocks and per-request blocks equal the 40-layer model's.
    types = (["linear_attention"] * 2 + ["full_attention"]) * 5 + (
        ["linear_attention"] * 3 + ["full_attention"]
    ) * 5
    assert (types.count("full_attention"), types.count("linear_attention")) == (10, 25)
    cfg = text_config(config, num_hidden_layers=35, layer_types=types)
    plan = plan_kv(cfg, 262_144, 8 * GiB)
    assert (plan.group_size, plan.mamba_groups, plan.padding_layers) == (10, 3, 5)
    assert (plan.num_blocks, plan.tokens) == (397, 412_980)


def test_near_equal_layer_counts_use_the_larger_group(config):
    # 8 full + 10 linear: 10 < 1.5 * 8, so group_size = 10 (one padded full group, one linear group)
    # num_blocks = 3,971 // 10 = 397; per request at 32,768 = cdiv(32,768, 1,056) + 1 = 32 + 1 = 33
    # 397 / 33 = 12.0303; tokens = int(12.0303 * 32,768) = 394,208
    types = ["linear_attention", "full_attention"] * 8 + ["linear_attention"] * 2
    cfg = text_config(config, num_hidden_layers=18, layer_types=types)
    plan = plan_kv(cfg, 32_768, 8 * GiB)
    assert (plan.group_size, plan.full_groups, plan.mamba_groups, plan.padding_layers) == (
        10,
        1,
        1,
        2,
    )
    assert plan.blocks_per_request == 33
    assert plan.tokens == 394_208


def test_block_alignment_64(config):
    # block = 64 * cdiv(2,146,304, 64 * 2,048) = 64 * 17 = 1,088; page = 2,228,224
    # num_blocks = 8 GiB // 2,228,224 // 10 = 3,855 // 10 = 385
    # per request = cdiv(262,144, 1,088) + 3 = 241 + 3 = 244; 385 / 244 = 1.5779
    # tokens = int(1.5779 * 262,144) = 413,628
    plan = plan_kv(config, 262_144, 8 * GiB, block_alignment=64)
    assert (plan.block_size, plan.num_blocks, plan.tokens) == (1088, 385, 413_628)


def test_prefix_caching_align_mode_keeps_two_states(config):
    # MambaSpec.max_memory_usage_bytes in "align" mode: 2 pages per linear group
    # per request = 249 + 3 * 2 = 255; 397 / 255 = 1.5569; tokens = 408,122
    plan = plan_kv(config, 262_144, 8 * GiB, mamba_cache_mode="align")
    assert plan.blocks_per_request == 255
    assert (plan.tokens, f"{plan.max_concurrency:.2f}") == (408_122, "1.56")


def test_rejects_config_without_full_attention(config):
    cfg = text_config(config, layer_types=["linear_attention"] * 40)
    with pytest.raises(ValueError, match="full_attention"):
        plan_kv(cfg, 4096, 8 * GiB)


# --- CLI -------------------------------------------------------------------------------------


@pytest.fixture
def run_cli(capsys, config_path):
    def run(*args):
        rc = cli.main(["plan-kv", "--config", str(config_path), "--max-model-len", "262144", *args])
        return rc, capsys.readouterr()

    return run


def test_cli_json_fits(run_cli):
    rc, out = run_cli("--kv-cache-memory-bytes", "8589934592", "--json")
    data = json.loads(out.out)
    assert rc == 0
    assert set(data) == {
        "block_size",
        "bytes_per_block",
        "num_blocks",
        "tokens",
        "max_concurrency",
        "needed_bytes",
        "fits",
    }
    assert (data["block_size"], data["tokens"], data["fits"]) == (1056, 412_980, True)
    assert round(data["max_concurrency"], 2) == 1.58


def test_cli_json_refused(run_cli):
    rc, out = run_cli("--kv-cache-memory-bytes", "4GiB", "--json")
    data = json.loads(out.out)
    assert rc == 1
    assert data["fits"] is False
    assert data["needed_bytes"] == 5_449_973_760


def test_cli_human_output(run_cli):
    rc, out = run_cli("--kv-cache-memory-bytes", "8GiB")
    assert rc == 0
    for text in ("1,056 tokens", "412,980 tokens", "1.58x", "21,626,880"):
        assert text in out.out
    rc, out = run_cli("--kv-cache-memory-bytes", "4GiB")
    assert rc == 1
    assert "5.08 GiB" in out.out and "REFUSED" in out.out


def test_cli_console_script_exit_codes(config_path):
    # The installed entry point passes run()'s return value to sys.exit.
    base = [
        sys.executable,
        "-c",
        "import sys; from servefleet.cli import main; sys.exit(main())",
        "plan-kv",
        "--config",
        str(config_path),
        "--max-model-len",
        "262144",
        "--json",
        "--kv-cache-memory-bytes",
    ]
    ok = subprocess.run(base + ["8GiB"], capture_output=True, text=True)
    refused = subprocess.run(base + ["4GiB"], capture_output=True, text=True)
    assert (ok.returncode, refused.returncode) == (0, 1)
    assert json.loads(refused.stdout)["fits"] is False


def test_cli_bad_config_exits_2(tmp_path):
    rc = cli.main(
        [
            "plan-kv",
            "--config",
            str(tmp_path / "missing.json"),
            "--max-model-len",
            "4096",
            "--kv-cache-memory-bytes",
            "1GiB",
        ]
    )
    assert rc == 2


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint dir with 3,000 bytes of safetensors and an unrelated file."""
    tmp_path = tmp_path / "ckpt"
    tmp_path.mkdir()
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 2000)
    (tmp_path / "tokenizer.json").write_bytes(b"\0" * 5000)
    return tmp_path


def test_cli_budget_fits(run_cli, checkpoint):
    # 3,000 B weights + 8 GiB pool + 1 GiB overhead = 9 GiB + 3,000 B <= 10 GiB
    rc, out = run_cli(
        "--kv-cache-memory-bytes",
        "8GiB",
        "--checkpoint",
        str(checkpoint),
        "--usable-memory-bytes",
        "10GiB",
        "--overhead-bytes",
        "1GiB",
        "--json",
    )
    data = json.loads(out.out)
    assert rc == 0
    assert data["weights_bytes"] == 3000
    assert (data["usable_memory_bytes"], data["overhead_bytes"]) == (10 * GiB, GiB)
    assert data["budget_fits"] is True and data["fits"] is True


def test_cli_budget_refused(run_cli, checkpoint):
    # 9 GiB + 3,000 B > 9 GiB usable: the KV pool fits but the process does not -> exit 1
    rc, out = run_cli(
        "--kv-cache-memory-bytes",
        "8GiB",
        "--checkpoint",
        str(checkpoint),
        "--usable-memory-bytes",
        str(9 * GiB),
        "--overhead-bytes",
        "1GiB",
    )
    assert rc == 1
    assert "OVER BUDGET" in out.out
    rc, out = run_cli(
        "--kv-cache-memory-bytes",
        "8GiB",
        "--checkpoint",
        str(checkpoint),
        "--usable-memory-bytes",
        str(9 * GiB),
        "--overhead-bytes",
        "1GiB",
        "--json",
    )
    assert rc == 1 and json.loads(out.out)["budget_fits"] is False


def test_cli_budget_defaults_to_spark(run_cli, checkpoint):
    # Defaults: 114 GiB usable (DGX Spark), 4 GiB overhead estimate.
    rc, out = run_cli("--kv-cache-memory-bytes", "8GiB", "--checkpoint", str(checkpoint), "--json")
    data = json.loads(out.out)
    assert rc == 0
    assert (data["usable_memory_bytes"], data["overhead_bytes"]) == (114 * GiB, 4 * GiB)


def test_cli_budget_for_a_node_class_with_discrete_memory(run_cli, checkpoint, monkeypatch):
    # vLLM on an RTX 4090 (#28): the class's 24 GiB of VRAM, not the Spark's unified 114 GiB.
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # group_data/ is read from here
    args = ("--kv-cache-memory-bytes", "8GiB", "--checkpoint", str(checkpoint), "--json")
    rc, out = run_cli(*args, "--node-class", "rtx4090")
    assert rc == 0 and json.loads(out.out)["usable_memory_bytes"] == 24 * GiB
    rc, out = run_cli(*args, "--node-class", "spark")  # unified: the Spark's default
    assert rc == 0 and json.loads(out.out)["usable_memory_bytes"] == 114 * GiB
    rc, out = run_cli("--kv-cache-memory-bytes", "32GiB", *args[2:], "--node-class", "rtx4090")
    assert rc == 1 and json.loads(out.out)["budget_fits"] is False


def test_byte_counts_accept_units():
    from servefleet.engines.vllm.cli.plan_kv import parse_bytes

    assert parse_bytes("8589934592") == parse_bytes("8GiB") == 8 * GiB
    assert parse_bytes("8G") == 8 * GiB  # binary, with or without "i" (core.sizes)
    assert parse_bytes("1.5GiB") == 3 * GiB // 2
    with pytest.raises(argparse.ArgumentTypeError, match="decimal and lower-case units"):
        parse_bytes("80GB")
