# Spark hosts of the local testbed: Debian 12 guests without GPUs (Python 3.11, x86_64).
# Applied after group_data/spark.py and before group_data/testbed.py.
service_state = "stopped"  # provision everything, start nothing: no GPU to serve with
min_free_disk_bytes = 1 * 1024**3  # guests share the host's disk
# Only the real torch and vLLM wheels from the host's wheelhouse (/var/cache/servefleet/wheels,
# pip_find_links in group_data/testbed.py), not their ~4 GB closure: tests/unit/test_vllm_closure.py
# proves the closure resolves.
python_no_deps = True  # install the pinned wheels only
uv_cache_dir = "/var/cache/servefleet/uv"  # uv's cache shared by the guests (host-side)
model_include = ["*.json", "*.safetensors"]  # the tiny checkpoint has no tokenizer files
# The local hub's branch holding a tiny Qwen3.5-MoE checkpoint (no visual.*, no mtp.* tensors)
# under the real repo id; tests/e2e/test_spark.py publishes it (servefleet.hub.publish).
model_revision = "testbed-tiny"
