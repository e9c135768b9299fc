# Node class DGX Spark (GB10, aarch64, sm_121, 128 GB unified memory): the hardware only. Its
# engine is vLLM unless fleet.yml names another (group_data/vllm.py: the engine and its model).
# Checks: servefleet/fleet/contract.py; docs/knobs.md's spark list is generated from it.
expected_arch = "aarch64"  # DGX OS is Ubuntu 24.04 on Arm
min_driver_version = 580  # GB10 ships with the 580 driver series
min_free_disk_bytes = 20 * 1024**3  # the base tree and an engine's install (a vLLM venv ~10 GB, llama.cpp builds); the weights: model_min_free_disk_bytes
memory_model = "unified"  # GB10: CPU and GPU share the 128 GB; nvidia-smi reports no GPU memory
cuda_architectures = "121"  # GB10 (sm_121): what a build for this GPU targets (llama.cpp's CMAKE_CUDA_ARCHITECTURES)
memory_bandwidth_bytes_per_s = 273 * 10**9  # GB10 LPDDR5X: 273 GB/s (bench's roofline)
