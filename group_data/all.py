# Defaults for every servefleet host. Role files (spark.py, rtx4090.py, depot.py) and
# inventory/fleet.yml `data:` override these. servefleet/fleet/contract.py declares each key's
# check; docs/knobs.md's knob lists are generated from this file and the role files.

# --- Layout on the node --------------------------------------------------------------------
servefleet_root = "/opt/servefleet"  # everything servefleet installs lives here (a dedicated directory)
servefleet_user = "servefleet"  # unprivileged system user that runs the services; owns only cache/ and the models
models_root = None  # where model revisions live; None: {servefleet_root}/models (a dedicated directory, e.g. a big disk)

# --- Preflight ------------------------------------------------------------------------------
require_gpu = True  # fail a host without an NVIDIA GPU (False: the testbed, CPU-only checks)
min_driver_version = 580  # oldest NVIDIA driver major version the recipes accept
expected_arch = None  # CPU architecture the recipe is built for (x86_64 | aarch64), None: any
min_free_disk_bytes = 5 * 1024**3  # free space needed under servefleet_root for the base tree and an engine's install
usable_memory_bytes = None  # memory the serving engine may use; None: from the host, as memory_model says
memory_model = "discrete"  # discrete: the engine plans with the GPU's own memory; unified: with system memory (GB10)
gpu_memory_bytes = None  # one GPU's memory, used where nvidia-smi reports none (unified memory, no GPU); None: system memory
cuda_architectures = None  # CMAKE_CUDA_ARCHITECTURES of builds for this GPU ("89", "90;121"); None: the build's own

# --- OS packages and Python (distro-specific names are data) --------------------------------
os_packages = {  # apt packages per distro family, installed by deploys/base.py
    "debian": ["python3", "python3-venv", "ca-certificates", "curl", "rsync", "git"],
    "ubuntu": ["python3", "python3-venv", "ca-certificates", "curl", "rsync", "git"],
}
python_interpreter = {"debian": "python3", "ubuntu": "python3"}  # system Python per distro family
uv_version = "0.13.9"  # uv, in the tools venv (by pip); installs the other tools and makes the serving venvs

# --- Python package sources (a fleet mirror or an air-gapped wheelhouse needs no code change)
pip_index_url = None  # primary index URL; None: PyPI
pip_extra_index_urls = []  # further index URLs (e.g. PyTorch's cu130 index)
pip_find_links = []  # local wheel directories or URLs searched before the index
python_no_deps = False  # install pinned wheels without their dependency closure (wheelhouses)

# --- Service --------------------------------------------------------------------------------
service_state = "running"  # running | stopped: stopped provisions everything but starts nothing
service_enabled = True  # start the service at boot
service_syscall_filter = ["@system-service"]  # the units' SystemCallFilter= (allow list first, then "~@group" removals); checked by the sandbox probe before each restart
service_host = "127.0.0.1"  # address the API binds to; any other than loopback requires api_key_file
api_key_file = None  # operator-side file holding the API key (one line); None: no key (loopback only)
health_timeout_s = 600  # seconds a (re)started service may take to answer /health 200
health_settle_s = 30  # seconds a service must stay healthy after a start before it counts as up
releases_keep = 2  # releases kept on a node, current included: the previous one serves again instantly

# --- Metrics (docs/day2.md, "Prometheus") ---------------------------------------------------
metrics_textfile_dir = "/var/lib/prometheus/node-exporter"  # node_exporter's textfile directory (Debian's default): servefleet.prom, written by converge, drift and the gates; None: no metrics file

# --- Rollout performance gate (servefleet rollout; docs/rollouts.md) ------------------------
perf_gate = True  # bench each host before its upgrade and after its health gate; a slower release is rolled back (False: health gate only)
perf_gate_runs = 3  # measured bench requests per measurement, after one warm-up (the median counts)
perf_gate_prompt_tokens = 256  # prompt of each gate bench request, in tokens (TTFT)
perf_gate_max_tokens = 64  # tokens decoded by each gate bench request (decode tok/s)
perf_gate_decode_drop_pct = 10  # fail when median decode tok/s falls more than this % below the baseline; None: not checked
perf_gate_ttft_rise_pct = 25  # fail when median TTFT rises more than this % above the baseline; None: not checked
perf_gate_recheck_pct = 5  # a change within this many points of a threshold is not a clear pass: measured once more, the best of the two counts

# --- Models ---------------------------------------------------------------------------------
hf_endpoint = "https://huggingface.co"  # Hugging Face hub or a mirror speaking its API
hf_token_file = None  # operator-side file with a hub token (or $HF_TOKEN); None: anonymous
model_source = "hub"  # hub: each node downloads; depot: copy from the depot host
depot_host = None  # inventory name of the depot when model_source = "depot"
huggingface_hub_version = "2.4.0"  # hub client (`hf` CLI) installed into the tools venv
download_margin_bytes = 2 * 1024**3  # free disk required beyond a download, or the host fails
hub_timeout_seconds = 30  # operator-side hub API requests (revision -> sha, file list)
model_revision = "main"  # branch, tag or 40-hex commit sha (pin a sha for a reproducible fleet)
model_include = ["*"]  # glob patterns of the repo's files to fetch

# --- The roofline of `servefleet bench` (bandwidth: the node class's; bytes per token: the model's)
memory_bandwidth_bytes_per_s = None  # memory bandwidth of the GPU (or unified memory); None: no roofline

# --- Depot ----------------------------------------------------------------------------------
depot_user = "sfdepot"  # on the depot: read-only rsync account nodes copy models through
depot_address = None  # address nodes reach the depot at (private network); None: its ssh_hostname
depot_ssh_key = None  # operator-side fleet key for depot access; None: generated once in the cache
depot_bwlimit_kib = None  # rate limit of each node's copy from the depot (KiB/s); None: unlimited
depot_store = None  # the depot's verified copies; None: {servefleet_root}/depot
depot_models = []  # models a depot keeps: [{"repo_id": "org/name", "revision": "main", "include": ["*"]}]

# --- Rebuild (set by `servefleet rebuild`, not by hand) -------------------------------------
purge_models = False  # rebuild also deletes the model revisions (--purge-models)
previous_release = False  # rollback goes back from a healthy release too (set by `servefleet rollback`)
