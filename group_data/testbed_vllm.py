# vLLM hosts of the local testbed (any node class): Debian guests without GPUs (each release's own
# Python, x86_64). Applied after group_data/vllm.py and before group_data/testbed.py. The real unit,
# the real venv and patch, the real checkpoint layout; only the executable differs: the vLLM engine
# stand-in (servefleet_dev/standin/), which replays the real engine's startup lines recorded on an
# H200 for exactly this checkpoint and these two values.
vllm_executable = "/var/cache/servefleet/standin/vllm-standin"  # the engine stand-in (testbed only; root-owned)
max_model_len = 4096  # a combination recorded on the H200: 2,957,684 tokens, 722.09x
kv_cache_memory_bytes = 2 * 1024**3  # with max_model_len 4096 (tests/fixtures/h200/vllm/index.json)
min_free_disk_bytes = 1 * 1024**3  # guests share the host's disk
health_timeout_s = 120  # the stand-in starts in a second or two
health_settle_s = 3  # a crash loop shows within seconds here
perf_gate = False  # the engine stand-in's speed means nothing: rollouts gate these hosts on health only
# Only the real torch and vLLM wheels from the host's wheelhouse (/var/cache/servefleet/wheels,
# pip_find_links in group_data/testbed.py), not their ~4 GB closure: tests/unit/test_vllm_closure.py
# proves the closure resolves.
python_no_deps = True  # install the pinned wheels only
uv_cache_dir = "/var/cache/servefleet/uv"  # uv's cache shared by the guests (host-side)
model_include = ["*.json", "*.safetensors"]  # the tiny checkpoint has no tokenizer files
model_revision = "testbed-tiny"  # the local hub's branch holding a tiny Qwen3.5-MoE checkpoint (servefleet_dev.testbed.material)
