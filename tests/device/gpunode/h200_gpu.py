# The GPU node on the lent H200 (tests/device/gpunode.sh): one rtx4090 host, reached like a
# real node (the sudo admin, the host key pinned, strict checking), its sshd on the machine's
# loopback. Group data: rtx4090.py < llamacpp.py < h200_gpu.py (this file's name), group_data/.
# SERVEFLEET_GPUNODE_DIR: where the carried payload is (the launching chroot's /gpunode).
# SERVEFLEET_GPUNODE_REHEARSAL=1: the same run on a machine without a GPU (this workplace's):
# host data turns the GPU off and builds llama.cpp for the CPU, from the testbed's ccache.
import os

from servefleet.fleet.inventory import InventoryHost, stop_on_bad_input, validate_hosts
from servefleet_dev.testbed import gpunode

_HERE = os.environ.get("SERVEFLEET_GPUNODE_DIR", "/gpunode")
_REHEARSAL = {
    "require_gpu": False,
    "llamacpp_cmake_flags": {
        "GGML_CUDA": "OFF",
        "GGML_NATIVE": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",
        "LLAMA_BUILD_UI": "OFF",
        "BUILD_SHARED_LIBS": "OFF",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_OPENSSL": "OFF",
        "CMAKE_BUILD_TYPE": "Release",
    },
    "llamacpp_ccache_dir": "/var/cache/servefleet/ccache",
    "llamacpp_server_args": ["--threads", "1"],
    "perf_gate_decode_drop_pct": 20,
}


def _hosts():
    data = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": gpunode.SSH_PORT,
        "ssh_user": "fleetadmin",
        "ssh_key": f"{_HERE}/ssh/id_ed25519",
        "ssh_known_hosts_file": f"{_HERE}/ssh/known_hosts",
        "ssh_strict_host_key_checking": "yes",
        "_sudo": True,
        "hf_endpoint": f"http://127.0.0.1:{gpunode.HUB_PORT}",
    }
    if os.environ.get("SERVEFLEET_GPUNODE_REHEARSAL") == "1":
        data.update(_REHEARSAL)
    validate_hosts(
        [
            InventoryHost(
                gpunode.NODE,
                gpunode.GROUPS,
                data,
                "tests/device/gpunode/h200_gpu.py",
            )
        ]
    )
    return [(gpunode.NODE, data)]


# pyinfra's groups (gpunode.GROUPS: the class's, its engine's), each a module-level list; the
# last, this file's name, pyinfra adds itself.
globals().update({g: stop_on_bad_input(_hosts) for g in gpunode.GROUPS[:-1]})
