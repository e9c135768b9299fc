# RTX 4090 (24 GB VRAM, x86_64): llama.cpp Q4_K_M recipe.
expected_arch = "x86_64"
min_driver_version = 580  # the field setup: driver 580.65.06 / CUDA 13.0
service_port = 8080  # llama-server's usual port
