# The lent H200 as a GPU node of the 4090 recipe (tests/device/gpunode.sh; docs/evidence.md):
# a testbed guest image under real systemd with the GPU bound in, converged over SSH by
# deploys/serve_q4_llamacpp.py with require_gpu = True (all.py). This file-name group is applied
# after group_data/rtx4090.py and group_data/llamacpp.py; it changes only what that machine differs in: the GPU's
# architecture, and the carried mirror, wheelhouse and hub that replace the network there.
cuda_architectures = "90"  # H200 (sm_90) in place of the 4090's 89
llamacpp_git_url = "/var/cache/servefleet/git/llama.cpp.git"  # the carried mirror (no network there)
llamacpp_tag = "b9785"  # the mirror's release (the testbed's pin: b9784 + 1 commit)
llamacpp_commit = "8724b88a3cdc84e82e64d21fb95287ae91e0c512"  # = servefleet_dev.testing.llama_src.commits()["b9785"]
pip_index_url = "http://127.0.0.1:8092/simple"  # the carried wheelhouse of the tools venv's pins
model_repo = "servefleet-tests/tiny-qwen35moe-missing-mtp-GGUF"  # on the carried local hub
model_file = "tiny-qwen35moe-field-missing-mtp.gguf"  # block_count 41, nextn 1, tensors for blk.0-39 only
served_model_name = "tiny-qwen35moe"  # the tiny model's API name
llamacpp_context_bytes = 256 * 1024**2  # the tiny model's KV cache and buffers at -c 65536, rounded up
