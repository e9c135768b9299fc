# RTX 4090: llama.cpp serving the Q4_K_M GGUF of Qwen-AgentWorld-35B-A3B, step by step.
#   pyinfra inventory/rtx4090.py deploys/serve_q4_llamacpp.py
# Knobs: group_data/rtx4090.py (docs/recipes.md, Recipe 2).
# A failing check stops only the host concerned.
from servefleet.recipes import base, llamacpp

if base.begin("serve_q4_llamacpp"):  # data checked; hosts of other roles: a visible no-op
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
