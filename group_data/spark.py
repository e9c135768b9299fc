# DGX Spark (GB10, aarch64, sm_121, 128 GB unified memory): BF16 vLLM recipe.
expected_arch = "aarch64"  # DGX OS is Ubuntu 24.04 on Arm
min_driver_version = 580  # GB10 ships with the 580 driver series
