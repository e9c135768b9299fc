# Testbed rtx4090 hosts (no GPU, 2 shared cores): overrides group_data/rtx4090.py there.
# The source is the llama.cpp vendored in llama-cpp-python 0.3.36, committed into a local mirror
# (servefleet/testing/llama_src.py) that guests see under /var/cache/servefleet/git; the model is a
# tiny qwen35moe GGUF with the real missing-MTP defect, published to the testbed hub by the tests.
llamacpp_git_url = "/var/cache/servefleet/git/llama.cpp.git"  # the testbed mirror (a path)
llamacpp_tag = "llama-cpp-python-0.3.36"  # the mirror's tag: a label
llamacpp_commit = "2bbaf6a3f68f7f40738dacb5b67a39db0f749133"  # = servefleet.testing.llama_src.ensure_mirror()
llamacpp_cmake_flags = {  # as group_data/rtx4090.py, CPU only
    "GGML_CUDA": "OFF",  # no GPU, no CUDA toolkit in the guests
    "GGML_NATIVE": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",
    "BUILD_SHARED_LIBS": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "CMAKE_BUILD_TYPE": "Release",
}
llamacpp_ccache_dir = "/var/cache/servefleet/ccache"  # the host's ccache, shared by every guest
llamacpp_build_jobs = 2  # the machine has 2 cores
llamacpp_build_min_free_disk_bytes = 2 * 1024**3  # guests share the host's disk
model_repo = "servefleet-tests/tiny-qwen35moe-missing-mtp-GGUF"  # published by tests/e2e/test_llamacpp.py
model_file = "tiny-qwen35moe-missing-mtp.gguf"  # block_count 5, nextn 1, tensors for blk.0-3 only
served_model_name = "tiny-qwen35moe"  # the tiny model's API name
llamacpp_context_bytes = 256 * 1024**2  # the tiny model's KV cache and buffers at -c 65536, rounded up
llamacpp_ram_reserve_bytes = 256 * 1024**2  # guests see the host's RAM
llamacpp_server_args = []  # CPU build: no GPU layers
health_timeout_s = 120  # the tiny model loads in seconds
