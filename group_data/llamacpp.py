# Engine llama.cpp and its model: the Q4_K_M GGUF of Qwen-AgentWorld-35B-A3B
# (deploys/serve_q4_llamacpp.py), on whichever node class a host is (group_data/<class>.py: the
# hardware, its cuda_architectures in the build). Applied after the class's file; checks:
# servefleet/engines/llamacpp/logic/knobs.py and servefleet/fleet/contract.py.

# --- llama.cpp build ------------------------------------------------------------------------
llamacpp_git_url = "https://github.com/ggml-org/llama.cpp.git"  # source; a mirror or local path works
llamacpp_tag = "b9784"  # a label for the build's prefix name; the commit below is the pin
llamacpp_commit = "8be759e6f70d629638a7eb70db3824cbdcea370b"  # built and verified (describe: b9782-2-g8be759e6f)
llamacpp_cmake_flags = {  # -DKEY=VALUE; changing any of them builds into a new prefix (with CUDA: CMAKE_CUDA_ARCHITECTURES from the node class's cuda_architectures)
    "GGML_CUDA": "ON",  # CUDA backend (the toolkit is the operator's prerequisite)
    "GGML_NATIVE": "OFF",  # no -march=native: the binary does not depend on the build CPU
    "LLAMA_USE_PREBUILT_UI": "OFF",  # no web UI download at build time
    "LLAMA_BUILD_UI": "OFF",  # no npm build of the web UI either (on by default since ~b97xx)
    "BUILD_SHARED_LIBS": "OFF",  # static: the one llama-server binary is what gets installed
    "LLAMA_BUILD_TESTS": "OFF",  # only llama-server is built
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "CMAKE_BUILD_TYPE": "Release",
}
llamacpp_ccache = True  # compile through ccache (rebuilds after a flag change take minutes, not an hour)
llamacpp_ccache_dir = None  # CCACHE_DIR for builds; None: root's ~/.cache/ccache on the node
llamacpp_build_jobs = None  # parallel compile jobs; None: CPU count, at most one per 2 GiB free RAM
llamacpp_build_min_free_disk_bytes = 10 * 1024**3  # free disk needed before a build starts
llamacpp_min_nvcc_version = "13.0"  # oldest CUDA toolkit accepted (validated: CUDA 13.0, driver 580)
llamacpp_build_packages = {  # apt packages the build needs, per OS family
    "debian": ["build-essential", "cmake", "git", "ccache"],
    "ubuntu": ["build-essential", "cmake", "git", "ccache"],
}

# --- Model ----------------------------------------------------------------------------------
model_repo = "gaoqianshen/Qwen-AgentWorld-35B-A3B-Q4_K_M-GGUF"  # hub repo of the GGUF
model_revision = "main"  # branch, tag or commit of model_repo
model_file = "qwen-agentworld-35b-a3b-q4_k_m.gguf"  # the GGUF served (21,166,758,816 bytes)
model_min_free_disk_bytes = 0  # beyond the node class's floor: none (the GGUF's download checks its own space, download_margin_bytes)
llamacpp_gguf_version = "0.19.0"  # gguf (PyPI) in the tools venv: the lint reads the file on the node
llamacpp_gguf_overrides = True  # pass the lint's --override-kv fix (False: serve the file as is)

# --- Service --------------------------------------------------------------------------------
service_port = 8080  # llama-server's usual port
served_model_name = "qwen-agentworld-35b-a3b"  # the model name the API answers to (--alias)
llamacpp_context = 65536  # -c: context size in tokens
llamacpp_context_bytes = int(1.75 * 1024**3)  # VRAM beyond the file at -c 65536 (field: 21.4 GiB in use)
llamacpp_ram_reserve_bytes = 2 * 1024**3  # RAM that must be available at start (with a GPU: only this)
llamacpp_server_args = ["--n-gpu-layers", "all"]  # further llama-server arguments: every layer on the GPU
bytes_per_token = None  # bytes read per decoded token (bench's roofline); None: not estimated for this GGUF
