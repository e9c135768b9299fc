# Node class RTX 4090 (Ada, sm_89, 24 GB VRAM, ~30 GiB RAM, x86_64): the hardware only. Its
# engine is llama.cpp unless fleet.yml names another (group_data/llamacpp.py: the engine and its
# model). Checks: servefleet/fleet/contract.py.
expected_arch = "x86_64"  # the RTX 4090 nodes are x86_64 workstations
min_driver_version = 580  # the field setup: driver 580.65.06 / CUDA 13.0
memory_model = "discrete"  # 24 GB of VRAM of its own: the engine plans with the GPU's memory
gpu_memory_bytes = 24 * 1024**3  # RTX 4090: 24 GiB (what nvidia-smi reports rules where it reports)
cuda_architectures = "89"  # Ada (sm_89): what a build for this GPU targets
memory_bandwidth_bytes_per_s = 1008 * 10**9  # GDDR6X: 1,008 GB/s (bench's roofline)
