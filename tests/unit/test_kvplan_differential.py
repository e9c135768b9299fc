"""plan-kv against vLLM 0.24.0 itself: random hybrid configs, every number compared.

servefleet_dev/testing/kvplan_probe.py runs inside the cached venv holding the real vllm 0.24.0
wheel (the one tests/unit/test_vllm_loader.py uses) and sizes each config with vLLM's own
config objects and functions; this test runs servefleet.engines.vllm.logic.kvplan.plan_kv on the same configs
and compares every field plan-kv reports that vLLM also determines.

The seed comes from SERVEFLEET_KVPLAN_SEED, or is random; it is printed and in every failure
message. To rerun a failure:
    SERVEFLEET_KVPLAN_SEED=<seed> pytest -s tests/unit/test_kvplan_differential.py

N: one case costs vLLM ~10-20 ms of CPU here (ModelConfig + VllmConfig from a config.json,
the block-size alignment, grouping, the engine's get_kv_cache_configs and a binary search for
the refusal hint), after ~5 s of importing vLLM. With 600 cases the probe took 25-35 s and
this file 30-40 s while other test runs kept both cores busy (load ~3.5; 1,000 cases took 45 s
then), under a 60 s budget on 2 shared cores, and every branch is still reached (the rarest
combination checked is ~5% of cases: ~30 expected). SERVEFLEET_KVPLAN_N overrides it
(e.g. 3000 for a longer local run; 5 x 3,000 seeds were run while writing this).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from servefleet.engines.vllm.logic.kvplan import (
    GiB,
    attention_block_size,
    attn_bytes_per_token,
    format_gib,
    load_config,
    mamba_state_bytes,
    plan_kv,
    read_model,
)
from servefleet_dev.testing import kvplan_probe
from servefleet_dev.testing.wheels import cache_lock, vllm_venv

VERSION = "0.24.0"
PROBE = Path(kvplan_probe.__file__)
N = int(os.environ.get("SERVEFLEET_KVPLAN_N", "600"))
SEED = int(os.environ.get("SERVEFLEET_KVPLAN_SEED") or random.SystemRandom().randrange(2**32))
AGENTWORLD = Path(__file__).resolve().parents[1] / "fixtures" / "agentworld-config.json"
# The published numbers (tests/unit/test_kvplan.py derives them by hand).
AGENTWORLD_CASE = {
    "config": load_config(AGENTWORLD),
    "max_model_len": 262_144,
    "kv_cache_memory_bytes": 8 * GiB,
    "block_alignment": 16,
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
}
REPRO = f"SERVEFLEET_KVPLAN_SEED={SEED} SERVEFLEET_KVPLAN_N={N}"


def _edge_cases() -> list[tuple[str, dict]]:
    """Head fields absent or null, for the three architectures: shapes kept out of the random
    cases, where plan-kv must either refuse (ValueError) or give vLLM's numbers."""
    moe = AGENTWORLD_CASE["config"]
    dense = {
        **moe,
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {**moe["text_config"], "model_type": "qwen3_5_text"},
    }
    flat = {
        **{k: v for k, v in moe["text_config"].items() if k != "layer_types"},
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
    }
    out = []
    for arch, config in (("Qwen3.5-MoE", moe), ("Qwen3.5", dense), ("Qwen3-Next", flat)):
        for key in ("head_dim", "num_key_value_heads"):
            for how in ("absent", "null"):
                edited = json.loads(json.dumps(config))
                text = edited.get("text_config", edited)
                if how == "absent":
                    del text[key]
                else:
                    text[key] = None
                out.append((f"{arch}, {key} {how}", {**AGENTWORLD_CASE, "config": edited}))
    return out


EDGE_CASES = _edge_cases()


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory) -> dict:
    """The probe's output for N random cases (seed SEED), the AgentWorld case, the edge cases."""
    work = tmp_path_factory.mktemp("kvplan-differential")
    extra = work / "cases.json"
    extra.write_text(json.dumps([AGENTWORLD_CASE] + [case for _, case in EDGE_CASES]))
    print(f"\nkvplan differential: seed {SEED}, {N} random configs (rerun: {REPRO})")
    venv = vllm_venv(VERSION)  # built once by whichever test run needs it first
    # Held while the probe runs: test_vllm_loader patches qwen3_5.py in this venv under it.
    with cache_lock(venv.name):
        started = time.monotonic()
        done = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-I",
                str(PROBE),
                "--seed",
                str(SEED),
                "--n",
                str(N),
                "--cases",
                str(extra),
                "--workdir",
                str(work),
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
        elapsed = time.monotonic() - started
    assert done.returncode == 0, f"[{REPRO}] probe failed:\n{done.stderr[-4000:]}"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    header, results = lines[0], lines[1:]
    assert header["vllm"] == VERSION, header
    assert len(results) == N + 1 + len(EDGE_CASES), f"[{REPRO}] {len(results)} results"
    print(
        f"kvplan differential: vLLM {header['vllm']} sized {len(results)} cases in {elapsed:.1f} s"
    )
    return {"random": results[:N], "agentworld": results[N], "edge": results[N + 1 :]}


def plan_for(result: dict):
    """plan-kv for the case a probe line holds (the pool as the probe resolved it)."""
    case = result["case"]
    return plan_kv(
        case["config"],
        case["max_model_len"],
        result["vllm"]["kv_cache_memory_bytes"],
        block_alignment=case["block_alignment"],
        mamba_ssm_cache_dtype=case["mamba_ssm_cache_dtype"],
        mamba_cache_mode=case["mamba_cache_mode"],
    )


def differences(result: dict) -> dict:
    """{field: (plan-kv, vLLM)} for every field where they differ."""
    case, v = result["case"], result["vllm"]
    plan = plan_for(result)
    m = read_model(case["config"], case["mamba_ssm_cache_dtype"])
    logs_block_size = plan.block_size > case["block_alignment"]
    pairs = [
        # what the sizing reads from the config (ModelConfig / CacheConfig after vLLM's hooks)
        ("num_full_layers", m.num_full_layers, v["num_full_layers"]),
        ("num_linear_layers", m.num_linear_layers, v["num_linear_layers"]),
        ("num_kv_heads", m.num_kv_heads, v["num_kv_heads"]),
        ("head_size", m.head_dim, v["head_size"]),
        ("model_dtype", m.model_dtype, v["model_dtype"]),
        ("kv_cache_dtype", m.model_dtype, v["kv_cache_dtype"]),
        ("mamba_state_dtypes", [m.model_dtype, m.ssm_dtype], v["mamba_state_dtypes"]),
        # step 1: page sizes
        ("attn_bytes_per_token", attn_bytes_per_token(m), v["attn_bytes_per_token"]),
        ("mamba_state_bytes", mamba_state_bytes(m), v["mamba_state_bytes"]),
        # step 2: block size and padding
        (
            "attention_block_size()",
            attention_block_size(m, case["block_alignment"]),
            v["block_size"],
        ),
        ("block_size", plan.block_size, v["block_size"]),
        ("page_bytes", plan.page_bytes, v["page_bytes"]),
        ("page_bytes (attention spec)", plan.page_bytes, v["attn_page_bytes"]),
        ("page_bytes (mamba spec)", plan.page_bytes, v["mamba_page_bytes"]),
        ("mamba_padding_bytes", plan.mamba_padding_bytes, v["mamba_padding_bytes"]),
        # step 3: groups
        ("group_size", plan.group_size, v["group_size"]),
        ("full_groups", plan.full_groups, v["full_groups"]),
        ("mamba_groups", plan.mamba_groups, v["mamba_groups"]),
        ("padding_layers", plan.padding_layers, v["padding_layers"]),
        ("bytes_per_block", plan.bytes_per_block, v["bytes_per_block"]),
        # step 4: pool, refusal, capacity
        ("kv_cache_memory_bytes", plan.kv_cache_memory_bytes, v["kv_cache_memory_bytes"]),
        ("num_blocks", plan.num_blocks, v["num_blocks"]),
        ("blocks_per_request", plan.blocks_per_request, v["blocks_per_request"]),
        ("needed_bytes", plan.needed_bytes, v["needed_bytes"]),
        ("estimated_max_model_len", plan.estimated_max_model_len, v["estimated_max_model_len"]),
        ("max_concurrency", plan.max_concurrency, v["max_concurrency"]),
        (
            "max_concurrency (2 decimals)",
            f"{plan.max_concurrency:.2f}",
            f"{v['max_concurrency']:.2f}",
        ),
        ("tokens", plan.tokens, v["tokens"]),
        ("fits", plan.fits, not v["refused"]),
        # as vLLM logs them
        (
            "log_block_size",
            f"Setting attention block size to {plan.block_size} tokens to ensure that attention "
            "page size is >= mamba page size."
            if logs_block_size
            else None,
            v["log_block_size"],
        ),
        (
            "log_tokens",
            f"GPU KV cache size: {plan.tokens:,} tokens" if plan.fits else None,
            v["log_tokens"],
        ),
        (
            "log_concurrency",
            f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
            f"{plan.max_concurrency:.2f}x"
            if plan.fits
            else None,
            v["log_concurrency"],
        ),
    ]
    diff = {name: (ours, theirs) for name, ours, theirs in pairs if ours != theirs}
    if v["refused"]:
        # "To serve at least one request with the model's max seq len (L), (X GiB KV cache is
        # needed, which is larger than the available KV cache memory (Y GiB). [Based on the
        # available memory, the estimated maximum model length is E. ]Try increasing ..."
        hint = (
            f"Based on the available memory, the estimated maximum model length is "
            f"{plan.estimated_max_model_len}. "
            if plan.estimated_max_model_len
            else "Try increasing"
        )
        for text in (
            f"max seq len ({plan.max_model_len})",
            f"({format_gib(plan.needed_bytes)} GiB KV cache is needed, which is larger "
            f"than the available KV cache memory "
            f"({format_gib(plan.kv_cache_memory_bytes)} GiB). {hint}",
        ):
            if text not in v["refusal"]:
                diff.setdefault("refusal", (text, v["refusal"]))
    return diff


def test_probe_sized_the_cases_this_test_generates(vllm_results):
    """The probe's cases are the ones random_cases(SEED, N) gives here, and none failed."""
    results = vllm_results["random"]
    errors = [(r["index"], r["error"]) for r in results if "error" in r]
    assert not errors, f"[{REPRO}] vLLM failed on {len(errors)} cases, first: {errors[:3]}"
    assert [r["case"] for r in results] == kvplan_probe.random_cases(SEED, N), REPRO


def test_plan_kv_matches_vllm_on_random_configs(vllm_results):
    results = vllm_results["random"]
    mismatches = []
    for result in results:
        if "error" in result:
            continue  # reported by the test above
        diff = differences(result)
        if diff:
            mismatches.append({"index": result["index"], "diff": diff, "case": result["case"]})
    refused = sum(r["vllm"]["refused"] for r in results if "vllm" in r)
    print(
        f"kvplan differential: seed {SEED}: {len(results)} configs, {refused} refused by vLLM, "
        f"{len(mismatches)} differ from plan-kv"
    )
    shown = "\n".join(
        f"case {m['index']}: {json.dumps(m['diff'], default=str)}\n  {json.dumps(m['case'])}"
        for m in mismatches[:3]
    )
    assert not mismatches, (
        f"[{REPRO}] plan-kv differs from vLLM {VERSION} on {len(mismatches)} of {len(results)} "
        f"configs; the first ones, {{field: [plan-kv, vLLM]}} and the case:\n{shown}"
    )
    # The random cases must reach both outcomes and the interesting branches.
    assert 0 < refused < len(results), REPRO
    if N >= 500:  # the rarest of these is ~5% of cases
        seen = {
            (
                r["case"]["mamba_cache_mode"],
                r["vllm"]["refused"],
                r["vllm"]["log_block_size"] is not None,
            )
            for r in results
        }
        assert len(seen) == 8, f"[{REPRO}] branches reached: {sorted(seen)}"


def test_agentworld_8gib_from_both_sides(vllm_results):
    """Qwen-AgentWorld-35B-A3B, 262,144 tokens, 8 GiB: block 1,056, 412,980 tokens, 1.58x."""
    result = vllm_results["agentworld"]
    assert "error" not in result, result.get("error")
    v = result["vllm"]
    assert v["block_size"] == 1056
    assert v["log_block_size"].startswith("Setting attention block size to 1056 tokens")
    assert v["tokens"] == 412_980
    assert v["log_tokens"] == "GPU KV cache size: 412,980 tokens"
    assert v["log_concurrency"] == "Maximum concurrency for 262,144 tokens per request: 1.58x"
    assert not v["refused"]

    plan = plan_kv(load_config(AGENTWORLD), 262_144, 8 * GiB)
    assert (plan.block_size, plan.tokens, f"{plan.max_concurrency:.2f}") == (1056, 412_980, "1.58")
    assert plan.fits
    assert differences(result) == {}


def test_absent_or_null_head_fields_refused_or_as_vllm(vllm_results):
    """Where vLLM's config classes fill in defaults (an absent head_dim is 256 there, not
    hidden_size // num_attention_heads) or vLLM fails (a null num_key_value_heads), plan-kv
    refuses with ValueError; where it answers, it gives vLLM's numbers."""
    outcomes = {}
    for (label, case), result in zip(EDGE_CASES, vllm_results["edge"], strict=True):
        try:
            plan_kv(case["config"], case["max_model_len"], case["kv_cache_memory_bytes"])
        except ValueError as exc:
            outcomes[label] = ("plan-kv refuses", str(exc))
            continue
        assert "error" not in result, f"{label}: vLLM fails ({result['error']}), plan-kv answers"
        assert differences(result) == {}, label
        outcomes[label] = ("same numbers", result["vllm"]["head_size"])
    # An absent head_dim: vLLM takes the class default, so plan-kv's fallback would be wrong.
    by_label = {
        label: result for (label, _), result in zip(EDGE_CASES, vllm_results["edge"], strict=False)
    }
    assert by_label["Qwen3.5-MoE, head_dim absent"]["vllm"]["head_size"] == 256
    assert by_label["Qwen3.5-MoE, head_dim null"]["vllm"]["head_size"] == 2048 // 16
    assert "error" in by_label["Qwen3.5-MoE, num_key_value_heads null"]
    assert {label for label, (what, _) in outcomes.items() if what == "same numbers"} == {
        "Qwen3.5-MoE, head_dim null",
        "Qwen3.5, head_dim null",
        "Qwen3-Next, head_dim null",
    }
