"""Build a tiny Qwen3.5-MoE checkpoint, or load one with vLLM's own loader on CPU.

Runs *inside* a venv holding the real vLLM wheel (see servefleet_dev.testing.wheels.vllm_venv),
as a script: it imports nothing from servefleet.

    python vllm_loader_probe.py make-checkpoint DIR [--keep-visual]
    python vllm_loader_probe.py load DIR [--language-model-only]

`load` constructs the model and loads its weights (no forward pass) and prints one JSON
line last on stdout: {"ok": true, "visual": "StageMissingLayer" | null, ...} or
{"ok": false, "error": "ValueError: Following weights were not initialized ..."}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
from pathlib import Path

# The published Qwen-AgentWorld-35B-A3B layout (shared/agentworld-config.json) at toy size:
# same architecture, layer pattern and head kinds, ~10 MB of weights.
TINY_TEXT_CONFIG = {
    "vocab_size": 1024,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "mtp_num_hidden_layers": 1,
    "max_position_embeddings": 4096,
    # Rotary on 0.25 of head_dim 128 = 32 dims = 16 frequencies, split over (t, h, w).
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [6, 5, 5],
        "mrope_interleaved": True,
    },
}
TINY_VISION_CONFIG = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "out_hidden_size": 256,
    "num_position_embeddings": 64,
}


def make_checkpoint(out: Path, keep_visual: bool = False) -> None:
    """Save a random tiny Qwen3_5MoeForConditionalGeneration, without visual.* tensors
    unless `keep_visual` (a vision-language checkpoint served text-only)."""
    import torch  # optional heavy dependency: only inside the vLLM venv
    from safetensors.torch import (
        load_file,
        save_file,
    )  # optional heavy dependency: only inside the vLLM venv
    from transformers import (
        Qwen3_5MoeConfig,
        Qwen3_5MoeForConditionalGeneration,
    )  # optional heavy dependency: only inside the vLLM venv

    torch.manual_seed(0)
    config = Qwen3_5MoeConfig(text_config=TINY_TEXT_CONFIG, vision_config=TINY_VISION_CONFIG)
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    model = Qwen3_5MoeForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out)
    if keep_visual:
        return

    # Like Qwen-AgentWorld: a text-only checkpoint of the multimodal architecture.
    for shard in out.glob("*.safetensors"):
        tensors = load_file(shard)
        kept = {name: t for name, t in tensors.items() if ".visual." not in f".{name}"}
        save_file(kept, shard, metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {
            k: v for k, v in data["weight_map"].items() if ".visual." not in f".{k}"
        }
        index.write_text(json.dumps(data, indent=2))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load(checkpoint: Path, language_model_only: bool) -> dict:
    """Construct and load `checkpoint` with vLLM's get_model on the CPU platform."""
    # Must come before anything else of vLLM is imported: this machine has no GPU.
    import torch  # optional heavy dependency: only inside the vLLM venv

    # The venv holds PyPI's vLLM wheel (a CUDA build: its _C has no CPU kernels). What is probed
    # is which modules get built and which weights load, not CPU kernels, so the probe takes the
    # plain CPU path on every x86 machine: on a CPU with AMX, vLLM 0.24.0 turns prefix caching
    # off after the hybrid model sized its Mamba blocks for it (its own validator then refuses
    # the config) and packs conv weights with an op only its CPU build has.
    torch.cpu._is_amx_tile_supported = lambda: False
    import vllm.platforms  # optional heavy dependency: only inside the vLLM venv
    import vllm.platforms.cpu  # optional heavy dependency: only inside the vLLM venv

    vllm.platforms._current_platform = vllm.platforms.cpu.CpuPlatform()

    import vllm  # optional heavy dependency: only inside the vLLM venv
    from vllm.config import (
        DeviceConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )  # optional heavy dependency: only inside the vLLM venv
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )  # optional heavy dependency: only inside the vLLM venv
    from vllm.model_executor.model_loader import (
        get_model,
    )  # optional heavy dependency: only inside the vLLM venv

    model_config = ModelConfig(
        model=str(checkpoint),
        dtype="bfloat16",
        language_model_only=language_model_only,
        max_model_len=512,
        skip_tokenizer_init=True,
        enforce_eager=True,
    )
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    result = {"vllm": vllm.__version__, "language_model_only": language_model_only}
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        try:
            model = get_model(vllm_config=vllm_config)
        except Exception as exc:  # the outcome under test, reported, not raised
            result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        else:
            visual = model.visual
            result.update(
                ok=True,
                model=type(model).__name__,
                visual=None if visual is None else type(visual).__name__,
                parameters=sum(p.numel() for p in model.parameters()),
            )
    # Which qwen3_5.py ran: the test compares this with the recorded hashes.
    source = Path(sys.modules["vllm.model_executor.models.qwen3_5"].__file__)
    result["qwen3_5_sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make-checkpoint")
    make.add_argument("dir", type=Path)
    make.add_argument("--keep-visual", action="store_true")
    run = sub.add_parser("load")
    run.add_argument("dir", type=Path)
    run.add_argument("--language-model-only", action="store_true")
    args = parser.parse_args()

    if args.command == "make-checkpoint":
        make_checkpoint(args.dir, keep_visual=args.keep_visual)
        print(json.dumps({"ok": True, "checkpoint": str(args.dir)}))
    else:
        print(json.dumps(load(args.dir, args.language_model_only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
