# llama.cpp's recipe, step by step: on an RTX 4090, the Q4_K_M GGUF of Qwen-AgentWorld-35B-A3B
# (on any node whose engine is llama.cpp: what it serves is data).
#   pyinfra inventory/rtx4090.py deploys/serve_q4_llamacpp.py
# Knobs: group_data/rtx4090.py (the node), group_data/llamacpp.py (docs/recipes.md, Recipe 2).
# A failing check stops only the host concerned.
from servefleet.engines.llamacpp import steps as llamacpp
from servefleet.recipes import base

if llamacpp.begin():  # data checked; hosts of another engine: a visible no-op
    base.node_base()  # preflight (x86_64, GPU + driver 580+, disk), OS packages, account and tree, uv
    llamacpp.build_packages()  # build-essential, cmake, git, ccache

    # Build: llama-server at the pinned commit into llama.cpp/<tag>-<flags hash>/ (only when
    # missing); `current` names it.
    built = llamacpp.build()

    # Model: the GGUF from the hub or the depot, verified; then linted on the node, which
    # derives the --override-kv fix for a GGUF that counts a missing MTP layer.
    model = llamacpp.model()
    llamacpp.gguf_lint_step(model)

    # Service: servefleet-llama.service; the release it installs is recorded on the node (the
    # previous one stays servable); restarted only when the unit, build, model or key changed.
    svc = llamacpp.service(built, model)

    # Health, only after a (re)start in this run: /health 200, one chat completion, settle; then
    # the release is recorded as the one running healthy.
    llamacpp.health(svc)
