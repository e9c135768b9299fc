# Engine vLLM and its model: Qwen/Qwen-AgentWorld-35B-A3B served in BF16 (deploys/serve_bf16.py),
# on whichever node class a host is (group_data/<class>.py: the hardware). Applied after the
# class's file; checks: servefleet/engines/vllm/logic/knobs.py and servefleet/fleet/contract.py.

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
model_min_free_disk_bytes = 80 * 1024**3  # the BF16 weights (~70 GB) and headroom, beyond the node class's min_free_disk_bytes
served_model_name = "Qwen/Qwen-AgentWorld-35B-A3B"  # model name the API answers to (--served-model-name)

# --- KV cache and memory ----------------------------------------------------------------------
max_model_len = 262144  # --max-model-len: longest request (prompt + output) in tokens
kv_cache_memory_bytes = 8 * 1024**3  # --kv-cache-memory-bytes: fixed KV pool; None: vLLM sizes it from free memory
kv_block_alignment = 16  # attention kernel block alignment plan-kv assumes (16: FLASH_ATTN)
memory_overhead_bytes = 4 * 1024**3  # non-weight, non-KV memory of the engine (estimate) in the budget
# usable_memory_bytes (group_data/all.py): None reads it from the host, as the node class's
# memory_model says (unified: system memory; discrete: the GPU's).

# --- Page cache -------------------------------------------------------------------------------
page_cache_policy = "auto"  # auto: evict the model files only when vLLM auto-sizes its pool; always | never
page_cache_drop_global = False  # also drop the host's whole clean page cache (/proc/sys/vm/drop_caches)

# --- Service ----------------------------------------------------------------------------------
service_port = 8000  # port of the OpenAI-compatible API (vLLM's usual one)
vllm_extra_args = []  # further `vllm serve` arguments, e.g. ["--gpu-memory-utilization", "0.85"]
health_timeout_s = 1800  # seconds to wait for /health after a (re)start (loading ~70 GB takes minutes)
# service_host / service_port / api_key_file / service_state: group_data/all.py. service_host
# 127.0.0.1 keeps the API on the node; 0.0.0.0 exposes it on every interface: set api_key_file then.

# --- Benchmark (servefleet bench): the roofline decode speed = the node class's bandwidth / this
bytes_per_token = 3 * 10**9 * 2  # ~3B active parameters x 2 bytes (BF16) read per token
