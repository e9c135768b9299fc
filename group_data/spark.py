# DGX Spark (GB10, aarch64, sm_121, 128 GB unified memory): BF16 vLLM recipe (deploys/serve_bf16.py).
# Checks: servefleet/fleet/contract.py; docs/knobs.md's spark list is generated from it.
expected_arch = "aarch64"  # DGX OS is Ubuntu 24.04 on Arm
min_driver_version = 580  # GB10 ships with the 580 driver series
min_free_disk_bytes = 100 * 1024**3  # venv (~10 GB) + BF16 weights (~70 GB) + headroom

# --- Python environment ---------------------------------------------------------------------
vllm_version = "0.24.0"  # vLLM release; its venv is {servefleet_root}/venvs/vllm-<version> (0.26.0 also patched)
torch_version = "2.11.0"  # torch pin (vLLM 0.24.0 and 0.26.0 both require torch==2.11.0)
torch_cuda = "13.0"  # torch.version.cuda the installed torch must report (PyPI's 2.11.0 is cu130)
uv_cache_dir = None  # uv's cache on the node; None: uv's default (~root/.cache/uv)

# --- vLLM patch -----------------------------------------------------------------------------
vllm_patch = True  # patch qwen3_5.py so --language-model-only builds no vision tower (False: vLLM's own file)
language_model_only = True  # serve with --language-model-only (the checkpoint has no visual.* weights)
trust_remote_code = False  # --trust-remote-code: run the model repo's own Python as the engine (True only for a repo you trust)

# --- Model ------------------------------------------------------------------------------------
model_repo = "Qwen/Qwen-AgentWorld-35B-A3B"  # hub repo of the checkpoint
model_revision = "main"  # branch, tag or commit sha to serve
model_include = ["*.json", "*.safetensors", "*.txt", "*.jinja"]  # files fetched: config, index, weights, tokenizer, chat template
served_model_name = "Qwen/Qwen-AgentWorld-35B-A3B"  # model name the API answers to (--served-model-name)

# --- KV cache and memory ----------------------------------------------------------------------
max_model_len = 262144  # --max-model-len: longest request (prompt + output) in tokens
kv_cache_memory_bytes = 8 * 1024**3  # --kv-cache-memory-bytes: fixed KV pool; None: vLLM sizes it from free memory
kv_block_alignment = 16  # attention kernel block alignment plan-kv assumes (16: FLASH_ATTN)
memory_overhead_bytes = 4 * 1024**3  # non-weight, non-KV memory of the engine (estimate) in the budget
# usable_memory_bytes (group_data/all.py): None reads it from the host; GB10 reports no GPU memory,
# so system memory is used there.

# --- Page cache -------------------------------------------------------------------------------
page_cache_policy = "auto"  # auto: evict the model files only when vLLM auto-sizes its pool; always | never
page_cache_drop_global = False  # also drop the host's whole clean page cache (/proc/sys/vm/drop_caches)

# --- Service ----------------------------------------------------------------------------------
vllm_extra_args = []  # further `vllm serve` arguments, e.g. ["--gpu-memory-utilization", "0.85"]
health_timeout_s = 1800  # seconds to wait for /health after a (re)start (loading ~70 GB takes minutes)
# service_host / service_port / api_key_file / service_state: group_data/all.py. service_host
# 127.0.0.1 keeps the API on the node; 0.0.0.0 exposes it on every interface: set api_key_file then.

# --- Benchmark (servefleet bench): the roofline decode speed = bandwidth / bytes read per token
memory_bandwidth_bytes_per_s = 273 * 10**9  # GB10 LPDDR5X: 273 GB/s
bytes_per_token = 3 * 10**9 * 2  # ~3B active parameters x 2 bytes (BF16) read per token
