# vLLM's recipe, step by step: on a bare DGX Spark, Qwen/Qwen-AgentWorld-35B-A3B served in BF16
# (on any node whose engine is vLLM: what it serves is data).
#   pyinfra inventory/spark.py deploys/serve_bf16.py
# Knobs: group_data/spark.py (the node), group_data/vllm.py (docs/recipes.md, Recipe 1).
# A failing check stops only the host concerned.
from servefleet.engines.vllm import steps as vllm
from servefleet.recipes import base

if vllm.begin():  # data checked; hosts of another engine: a visible no-op
    # Base: preflight (aarch64, GPU + driver, disk), OS packages, the account and tree, uv.
    base.node_base()

    # Python environment: venvs/vllm-<version> made with uv, torch + vLLM pinned, read back
    # (versions and torch.version.cuda); a mismatch fails the host with both values.
    env = vllm.python_env()

    # vLLM patch: with --language-model-only, qwen3_5.py builds no vision tower (vllm_patch = True).
    patched = vllm.patch(env)

    # Model: the checkpoint from the hub (or the depot), one directory per revision, linted.
    model = vllm.model()

    # Page cache: evict the model's files when vLLM sizes its pool from free memory (policy).
    vllm.page_cache(model, depends_on=[env.create, env.install, patched])

    # Memory preflight: plan-kv (max_model_len, KV pool) and weights + pool + overhead vs usable.
    vllm.memory_preflight(model)

    # Service: servefleet-vllm.service; the release it installs is recorded on the node (the
    # previous one stays servable); restarted only when the venv, patch, model, key or unit changed.
    svc = vllm.service(env, model, depends_on=[patched])

    # Health, only when the service was (re)started in this run: /health, KV log vs plan-kv, a
    # chat, a settle period; then the release is recorded as the one running healthy.
    vllm.health(model, svc)
