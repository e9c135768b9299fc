# RTX 4090: llama.cpp serving the Q4_K_M GGUF of Qwen-AgentWorld-35B-A3B. Run:
#   pyinfra inventory/rtx4090.py deploys/serve_q4_llamacpp.py
# Values: group_data/rtx4090.py (testbed: group_data/testbed_rtx4090.py); steps: servefleet/llamacpp.py.
from servefleet import base, llamacpp

if base.for_role("rtx4090", "serve_q4_llamacpp"):  # hosts of other roles: a visible no-op
    llamacpp.validate_data()  # bad data stops the whole run here, before any host is changed
    base.preflight()  # arch, GPU + driver 580+ (unless require_gpu = False), free disk
    base.os_packages()  # apt packages of this distro family
    base.service_user_and_tree()  # the servefleet user and /opt/servefleet/{tools,models,etc,bin,...}
    base.tools()  # the tools venv (uv)
    llamacpp.build_packages()  # build-essential, cmake, git, ccache
    built = llamacpp.build()  # nvcc/disk preflight; llama-server at the pinned commit into
    #                           llama.cpp/<tag>-<flags hash>/ (only when missing), `current` -> it, prune
    run = llamacpp.model()  # the GGUF from the hub or the depot, verified
    llamacpp.gguf_lint()  # gguf in the tools venv; lint the GGUF on the node (--override-kv fix)
    svc = llamacpp.service(built, run)  # servefleet-llama.service; restarted only when unit/binary/model changed
    llamacpp.health(svc)  # only after a (re)start: /health 200, then one chat completion
