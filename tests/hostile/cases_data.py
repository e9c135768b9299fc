"""Hostile data values: each one reaches the contract's checks the way the inventory does
(before any connection), and is refused naming its key, or is harmless: escaped where it is
written (the rendered unit has no extra directive)."""

from __future__ import annotations

import os
from pathlib import Path

from servefleet.core.errors import DataError
from servefleet.core.systemd import render_unit
from servefleet.engines.vllm import logic as vllm
from servefleet.fleet.data import HostData, Layer, validate
from servefleet_dev.testbed.material import load
from tests.hostile.table import harmless, refused

CATEGORY = "data values"
REPO = Path(__file__).resolve().parents[2]
SPARK = load("all", "spark", "vllm")
RTX = load("all", "rtx4090", "llamacpp")


def attempt(overrides: dict, base: dict = SPARK, groups=("spark", "vllm"), recipe="serve_bf16"):
    def run():
        layers = [Layer("--data", overrides), Layer("group_data", base)]
        try:
            validate(HostData("spark-01", list(groups), layers), recipe)
        except DataError as exc:
            return str(exc)
        return None

    return run


def case(name: str, overrides: dict, expected: str, **kw):
    return refused(CATEGORY, name, expected, attempt(overrides, **kw))


def unit_lines(data: dict) -> list[str]:
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        text = render_unit(
            "files/vllm/servefleet-vllm.service.j2",
            vllm.unit_context(data, "/opt/servefleet/models/o--m/" + "a" * 40),
        )
    finally:
        os.chdir(cwd)
    return [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]


def escaped_name_is_one_word():
    value = "a%nb$HOMEc"
    assert attempt({"served_model_name": value})() is None  # accepted: a legal name
    clean = unit_lines(SPARK)
    hostile = unit_lines({**SPARK, "served_model_name": value})
    assert [ln.split("=", 1)[0] for ln in hostile] == [ln.split("=", 1)[0] for ln in clean]
    text = render_unit_text({**SPARK, "served_model_name": value}).splitlines()
    assert '    --served-model-name "a%%nb$$HOMEc" \\' in text  # one quoted word, escaped
    assert "Description=vLLM serving a%%nb$HOMEc (servefleet)" in text


def render_unit_text(data: dict) -> str:
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return render_unit(
            "files/vllm/servefleet-vllm.service.j2",
            vllm.unit_context(data, "/opt/servefleet/models/o--m/" + "a" * 40),
        )
    finally:
        os.chdir(cwd)


def owned(name: str, args: list, expected: str, llama: bool = False):
    key = "llamacpp_server_args" if llama else "vllm_extra_args"
    kw = {"base": RTX, "groups": ("rtx4090",), "recipe": "serve_q4_llamacpp"} if llama else {}
    return case(f"{key}: {name}", {key: args}, expected, **kw)


# Extra arguments may not set again what the recipe renders from data (the engines take the
# last of a repeated flag): refused naming the key that sets it.
OWNED_CASES = [
    owned(
        "a second --host",
        ["--host", "0.0.0.0"],
        "'--host' sets what the recipe sets from service_host",
    ),
    owned("--host=", ["--host=0.0.0.0"], "from service_host"),
    owned("an abbreviated --host", ["--ho", "0.0.0.0"], "from service_host"),
    owned("the API key in argv", ["--api-key", "sk-x"], "from api_key_file"),
    owned("--api_key with an underscore", ["--api_key=sk-x"], "from api_key_file"),
    owned("another port", ["--port", "9"], "from service_port"),
    owned("a unix socket", ["--uds", "/tmp/s"], "from service_host"),
    owned("another served name", ["--served-model-name", "gpt-4"], "from served_model_name"),
    owned("another model", ["--model", "/tmp/evil"], "from model_repo"),
    owned("another pool", ["--kv-cache-memory-bytes", "1"], "from kv_cache_memory_bytes"),
    owned("another window", ["--max_model_len=999999"], "from max_model_len"),
    owned("--no-language-model-only", ["--no-language-model-only"], "from language_model_only"),
    owned("--trust-remote-code", ["--trust-remote-code"], "from trust_remote_code"),
    owned("--trust_remote_code=true", ["--trust_remote_code=true"], "from trust_remote_code"),
    owned("an abbreviated --trust-remote", ["--trust-remote"], "from trust_remote_code"),
    case(
        "served_model_name: a flag",
        {"served_model_name": "--trust-remote-code"},
        "not starting with '-'",
    ),
    case("served_model_name: -x", {"served_model_name": "-x"}, "'served_model_name'"),
    case("trust_remote_code: a string", {"trust_remote_code": "yes"}, "'trust_remote_code'"),
    owned("a second --host", ["--host", "0.0.0.0"], "from service_host", llama=True),
    owned("the API key in argv", ["--api-key", "sk-x"], "from api_key_file", llama=True),
    owned("another key file", ["--api-key-file", "/tmp/k"], "from api_key_file", llama=True),
    owned("-m another model", ["-m", "/tmp/evil.gguf"], "from model_file", llama=True),
    owned("a model URL", ["--model-url", "http://x/y.gguf"], "from model_file", llama=True),
    owned("another alias", ["-a", "gpt-4"], "from served_model_name", llama=True),
    owned("another context", ["-c", "1000000"], "from llamacpp_context", llama=True),
    owned("its own --override-kv", ["--override-kv", "x=int:1"], "from the GGUF lint", llama=True),
]


def extra_args_that_own_nothing_pass():
    assert (
        attempt(
            {
                "vllm_extra_args": [
                    "--enforce-eager",
                    "--gpu-memory-utilization",
                    "0.85",
                    "--max-num-seqs",
                    "8",
                ]
            }
        )()
        is None
    )
    assert (
        attempt(
            {"llamacpp_server_args": ["--n-gpu-layers", "all", "-ngl", "99"]},
            base=RTX,
            groups=("rtx4090",),
            recipe="serve_q4_llamacpp",
        )()
        is None
    )


# servefleet_root and the relocated directories: an allow list of places, and no overlap with
# root's tree (the service user owns the models root, rebuild deletes under servefleet_root).
PLACE_CASES = (
    [
        case(f"servefleet_root: {path}", {"servefleet_root": path}, why)
        for path, why in (
            ("/proc/1/root", "expected a directory of servefleet's own"),
            ("/proc/self/root", "expected a directory of servefleet's own"),
            ("/etc/systemd/system", "expected a directory of servefleet's own"),
            ("/usr/lib/x86_64-linux-gnu", "expected a directory of servefleet's own"),
            ("/var/lib/dpkg/info", "expected a directory of servefleet's own"),
            ("/boot/efi", "expected a directory of servefleet's own"),
            ("/tmp/servefleet", "expected a directory of servefleet's own"),
            ("/dev/shm/servefleet", "expected a directory of servefleet's own"),
            ("/run/servefleet", "expected a directory of servefleet's own"),
            ("/home/op/servefleet", "expected a directory of servefleet's own"),
            ("/sys/fs/x", "expected a directory of servefleet's own"),
            ("/var/lib/systemd/x", "expected a directory of servefleet's own"),
        )
    ]
    + [
        case(f"models_root: {path}", {"models_root": path}, why)
        for path, why in (
            ("/opt/servefleet/bin", "expected a directory of servefleet's own"),
            ("/opt/servefleet/venvs", "expected a directory of servefleet's own"),
            ("/opt/servefleet/etc", "expected a directory of servefleet's own"),
            ("/opt/servefleet/state", "expected a directory of servefleet's own"),
            ("/opt/servefleet/tools", "expected a directory of servefleet's own"),
            ("/opt/servefleet/llama.cpp", "expected a directory of servefleet's own"),
            ("/etc/systemd/system", "expected a directory of servefleet's own"),
            ("/etc/profile.d", "expected a directory of servefleet's own"),
            ("/etc/cron.daily", "expected a directory of servefleet's own"),
            ("/opt/servefleet/models/../bin", "'models_root'"),
        )
    ]
    + [
        # #27 rule 2: places root's own services trust, or whose contents rebuild would delete.
        case(f"{key}: {path}", {key: path}, "expected a directory of servefleet's own")
        for key, paths in (
            (
                "servefleet_root",
                (
                    "/var/lib/cloud",
                    "/var/lib/docker",
                    "/var/lib/snapd",
                    "/opt/nvidia",
                    "/srv/salt",
                    "/var/lib/private",
                    "/opt/servefleet/../../etc",
                    "/var/lib/servefleetx",
                    "/data/a/b/c/d",
                    "/mnt/lost+found",
                ),
            ),
            (
                "models_root",
                (
                    "/var/lib/cloud/scripts/per-boot",
                    "/var/lib/polkit-1/localauthority/50-local.d",
                    "/var/lib/dkms",
                    "/opt/nvidia",
                    "/srv/salt",
                    "/var/lib/docker/volumes",
                    "/var/lib/private",
                    "/opt/servefleet-models/sub",
                    "/data/.hidden",
                    "/scratch/-rf",
                ),
            ),
            (
                "depot_store",
                (
                    "/var/lib/cloud/scripts/per-boot",
                    "/var/lib/dkms",
                    "/srv/salt",
                    "/var/lib/docker/volumes",
                    "/opt/nvidia",
                ),
            ),
        )
        for path in paths
    ]
    + [
        case(
            "depot_store: root's bin",
            {"depot_store": "/opt/servefleet/bin"},
            "expected a directory of servefleet's own",
        ),
        case(
            "models_root: the root's own venvs, from a moved root",
            {"servefleet_root": "/data/sf", "models_root": "/data/sf/venvs"},
            "is inside servefleet_root '/data/sf'",
        ),
        case(
            "depot_store: /etc/systemd/system",
            {"depot_store": "/etc/systemd/system"},
            "expected a directory of servefleet's own",
        ),
        case(
            "depot_store and models_root: the same directory",
            {"depot_store": "/data/big/models", "models_root": "/data/big/models"},
            "overlap",
        ),
        case(
            "depot_store inside models_root",
            {"depot_store": "/data/big/models/depot", "models_root": "/data/big/models"},
            "overlap",
        ),
    ]
)


# Class 2: what root installs from, runs or compiles with lies where only root writes.
ROOT_READ_CASES = [
    case(
        "uv_cache_dir in the service user's cache",
        {"uv_cache_dir": "/opt/servefleet/cache/uv"},
        "key uv_cache_dir = '/opt/servefleet/cache/uv' is inside /opt/servefleet/cache",
    ),
    case("uv_cache_dir in /tmp", {"uv_cache_dir": "/tmp/uv"}, "key uv_cache_dir = '/tmp/uv'"),
    case("uv_cache_dir in /dev/shm", {"uv_cache_dir": "/dev/shm/uv"}, "only root writes"),
    case(
        "uv_cache_dir walking out of /var/cache",
        {"uv_cache_dir": "/var/cache/../../tmp/uv"},
        "'uv_cache_dir' = '/var/cache/../../tmp/uv'",
    ),
    case(
        "pip_find_links in the models root",
        {"pip_find_links": ["/opt/servefleet/models/w"]},
        "key pip_find_links[0] = '/opt/servefleet/models/w' is inside /opt/servefleet/models",
    ),
    case(
        "pip_find_links: a file:// URL in /tmp",
        {"pip_find_links": ["file:///tmp/wheels"]},
        "key pip_find_links[0]",
    ),
    case(
        "python_interpreter from the service user's cache",
        {"python_interpreter": {"debian": "/opt/servefleet/cache/python3", "ubuntu": "python3"}},
        "key python_interpreter['debian']",
    ),
    case(
        "pip_find_links in a relocated models root",
        {"models_root": "/data/models", "pip_find_links": ["/data/models/wheels"]},
        "is inside /data/models",
    ),
    case(
        "pip_find_links in the depot's store",
        {"pip_find_links": ["/opt/servefleet/depot/x"]},
        "is inside /opt/servefleet/depot",
    ),
    # metrics_textfile_dir: root writes what Prometheus is told; no other account may change it.
    case(
        "metrics_textfile_dir in /tmp",
        {"metrics_textfile_dir": "/tmp/metrics"},
        "key 'metrics_textfile_dir' = '/tmp/metrics': root writes servefleet's metrics there",
    ),
    case(
        "metrics_textfile_dir in the service user's models root",
        {"metrics_textfile_dir": "/opt/servefleet/models/prom"},
        "overlaps /opt/servefleet",
    ),
    case(
        "metrics_textfile_dir walking out of /var/lib",
        {"metrics_textfile_dir": "/var/lib/../../tmp"},
        "'metrics_textfile_dir' = '/var/lib/../../tmp'",
    ),
]


def _rtx_git(name, url, expected):
    return case(
        name,
        {"llamacpp_git_url": url},
        expected,
        base=RTX,
        groups=("rtx4090",),
        recipe="serve_q4_llamacpp",
    )


# #27 rule 2: anything root builds from is root's, a local llama.cpp repository included.
GIT_URL_CASES = [
    _rtx_git(
        "llamacpp_git_url: a repository in the models root",
        "/opt/servefleet/models/llama.cpp.git",
        "key llamacpp_git_url = "
        "'/opt/servefleet/models/llama.cpp.git' is inside /opt/servefleet/models",
    ),
    _rtx_git(
        "llamacpp_git_url: a repository in the service user's cache",
        "/opt/servefleet/cache/llama.git",
        "is inside /opt/servefleet/cache",
    ),
    _rtx_git(
        "llamacpp_git_url: file:// in /tmp",
        "file:///tmp/llama.cpp.git",
        "key llamacpp_git_url = '/tmp/llama.cpp.git'",
    ),
    _rtx_git(
        "llamacpp_git_url: a home directory",
        "/home/op/llama.cpp.git",
        "key llamacpp_git_url = '/home/op/llama.cpp.git'",
    ),
    _rtx_git("llamacpp_git_url: /dev/shm", "/dev/shm/l.git", "only root writes"),
]


def root_reads_in_roots_places_are_accepted():
    assert (
        attempt(
            {
                "uv_cache_dir": "/var/cache/servefleet/uv",
                "pip_find_links": ["/var/cache/servefleet/wheels", "https://example.org/w"],
                "python_interpreter": {"debian": "/usr/bin/python3.11", "ubuntu": "python3"},
            }
        )()
        is None
    )


def _rtx(name, overrides, expected):
    return case(
        name, overrides, expected, base=RTX, groups=("rtx4090",), recipe="serve_q4_llamacpp"
    )


_FLAGS = RTX["llamacpp_cmake_flags"]
# Values accepted before that should not be (the attacker's report, class 11).
VALUE_CASES = [
    case(
        "served_model_name: a bidi override (Trojan Source)",
        {"served_model_name": "tiny\u202egpt"},
        "'served_model_name'",
    ),
    case(
        "served_model_name: a bidi isolate",
        {"served_model_name": "a\u2066b"},
        "'served_model_name'",
    ),
    case("served_model_name: a C1 control", {"served_model_name": "a\x85b"}, "'served_model_name'"),
    case(
        "health_timeout_s: 10^30 (TimeoutStartSec)",
        {"health_timeout_s": 10**30},
        "an integer from 1 to 604800",
    ),
    case("max_model_len: 10^12", {"max_model_len": 10**12}, "'max_model_len'"),
    case(
        "kv_cache_memory_bytes: 2^60", {"kv_cache_memory_bytes": 2**60}, "'kv_cache_memory_bytes'"
    ),
    case("releases_keep: 10^9", {"releases_keep": 10**9}, "an integer from 1 to 100"),
    case("hub_timeout_seconds: 10^9", {"hub_timeout_seconds": 10**9}, "'hub_timeout_seconds'"),
    _rtx(
        "llamacpp_build_jobs: 1000000 (-j)",
        {"llamacpp_build_jobs": 10**6},
        "an integer from 1 to 1024",
    ),
    _rtx("llamacpp_context: 10^12", {"llamacpp_context": 10**12}, "'llamacpp_context'"),
    _rtx(
        "llamacpp_cmake_flags: a launcher list sh;-c;...",
        {"llamacpp_cmake_flags": {**_FLAGS, "CMAKE_C_COMPILER_LAUNCHER": "sh;-c;id"}},
        "without variables CMake runs",
    ),
    _rtx(
        "llamacpp_cmake_flags: another compiler",
        {"llamacpp_cmake_flags": {**_FLAGS, "CMAKE_CXX_COMPILER": "/tmp/evil"}},
        "'llamacpp_cmake_flags'",
    ),
    _rtx(
        "llamacpp_cmake_flags: a toolchain file",
        {"llamacpp_cmake_flags": {**_FLAGS, "CMAKE_TOOLCHAIN_FILE": "/tmp/x.cmake"}},
        "'llamacpp_cmake_flags'",
    ),
    _rtx(
        "llamacpp_cmake_flags: a project include",
        {"llamacpp_cmake_flags": {**_FLAGS, "CMAKE_PROJECT_INCLUDE": "/tmp/x.cmake"}},
        "'llamacpp_cmake_flags'",
    ),
    _rtx(
        "llamacpp_cmake_flags: a list in a plain value",
        {"llamacpp_cmake_flags": {**_FLAGS, "GGML_CUDA": "ON;-DX=1"}},
        "'llamacpp_cmake_flags'",
    ),
]


def architecture_lists_pass():
    assert (
        attempt(
            {"llamacpp_cmake_flags": {**_FLAGS, "CMAKE_CUDA_ARCHITECTURES": "89;90"}},
            base=RTX,
            groups=("rtx4090",),
            recipe="serve_q4_llamacpp",
        )()
        is None
    )


def places_that_are_allowed_pass():
    for data in (
        {"servefleet_root": "/srv/servefleet", "models_root": "/mnt/nvme0/models"},
        {"models_root": "/opt/servefleet/models", "depot_store": "/opt/servefleet/depot"},
        {"servefleet_root": "/var/lib/servefleet", "models_root": "/data/models"},
        {"servefleet_root": "/var/opt/servefleet-gpu", "depot_store": "/data/a/b/c"},
        {"servefleet_root": "/opt/servefleet_2", "models_root": "/opt/servefleet-m"},
    ):
        assert attempt(data)() is None, data


DEPOT = load("all", "depot")
ON_DEPOT = {"base": DEPOT, "groups": ("depot",), "recipe": None}


def depot_user_elsewhere_passes():
    """depot_user is made only on the depot: elsewhere it is the name nodes log in to the depot
    with, and may be anything, the node's own login user too."""
    assert attempt({"ssh_user": "ops", "depot_user": "ops"})() is None


# The accounts servefleet takes over (servefleet_user: nologin; depot_user on a depot: a forced
# rrsync command) are never the one it logs in as: the next run could not log in.
ACCOUNT_CASES = [
    case(
        "servefleet_user: the SSH login user",
        {"servefleet_user": "ops", "ssh_user": "ops"},
        "'servefleet_user' = 'ops' from --data is the SSH login user (ssh_user) of spark-01",
    ),
    case(
        "servefleet_user: the SSH login user (base)",
        {"servefleet_user": "ops", "ssh_user": "ops"},
        "is the SSH login user",
        recipe="base",
    ),
    case(
        "ssh_user: the default servefleet_user",
        {"ssh_user": "servefleet"},
        "'servefleet_user' = 'servefleet'",
    ),
    case(
        "depot_user: the depot's SSH login user",
        {"depot_user": "ops", "ssh_user": "ops"},
        "'depot_user' = 'ops' from --data is the SSH login user",
        **ON_DEPOT,
    ),
    case(
        "depot_user: servefleet_user",
        {"depot_user": "servefleet"},
        "'servefleet_user' and 'depot_user' are both 'servefleet'",
        **ON_DEPOT,
    ),
    harmless(
        CATEGORY,
        "depot_user: the login user of a host that is no depot",
        "accepted",
        depot_user_elsewhere_passes,
    ),
]

CASES = (
    OWNED_CASES
    + PLACE_CASES
    + ROOT_READ_CASES
    + GIT_URL_CASES
    + VALUE_CASES
    + ACCOUNT_CASES
    + [
        harmless(
            CATEGORY,
            "uv_cache_dir, pip_find_links, python_interpreter: root's places",
            "accepted as they are",
            root_reads_in_roots_places_are_accepted,
        ),
        harmless(
            CATEGORY,
            "llamacpp_cmake_flags: a CMake list of architectures",
            "accepted as it is",
            architecture_lists_pass,
        ),
        harmless(
            CATEGORY,
            "servefleet_root, models_root, depot_store: places on the allow list",
            "accepted as they are",
            places_that_are_allowed_pass,
        ),
        harmless(
            CATEGORY,
            "vllm_extra_args / llamacpp_server_args: flags the recipe does not own",
            "accepted as they are",
            extra_args_that_own_nothing_pass,
        ),
        case(
            "service_host: IPv6 scope id carrying a directive",
            {"service_host": "fe80::1%eth0\nExecStartPre=/bin/sh"},
            "'service_host'",
        ),
        case(
            "service_host: IPv6 scope id",
            {"service_host": "fe80::1%eth0"},
            "an IP address without a scope id",
        ),
        case("service_host: shell characters", {"service_host": "127.0.0.1;id"}, "'service_host'"),
        case("service_host: a host name", {"service_host": "localhost"}, "'service_host'"),
        case(
            "servefleet_root: a newline and a directive",
            {"servefleet_root": "/opt/sf\nExecStartPre=/tmp/x"},
            "'servefleet_root'",
        ),
        case("servefleet_root: /", {"servefleet_root": "/"}, "'servefleet_root' = '/'"),
        case("servefleet_root: /etc", {"servefleet_root": "/etc"}, "'servefleet_root' = '/etc'"),
        case(
            "servefleet_root: /usr/local",
            {"servefleet_root": "/usr/local"},
            "'servefleet_root' = '/usr/local'",
        ),
        case(
            "servefleet_root: /var (a parent of system dirs)",
            {"servefleet_root": "/var"},
            "'servefleet_root' = '/var'",
        ),
        case(
            "servefleet_root: a space",
            {"servefleet_root": "/opt/my servefleet"},
            "'servefleet_root'",
        ),
        case("servefleet_root: ..", {"servefleet_root": "/opt/../etc"}, "'servefleet_root'"),
        case(
            "servefleet_root: relative", {"servefleet_root": "opt/servefleet"}, "'servefleet_root'"
        ),
        case("servefleet_root: one level", {"servefleet_root": "/srv"}, "'servefleet_root'"),
        case("depot_store: /", {"depot_store": "/"}, "'depot_store' = '/'"),
        case("models_root: /home", {"models_root": "/home"}, "'models_root' = '/home'"),
        case("models_root: holds the root", {"models_root": "/opt"}, "'models_root' = '/opt'"),
        case("servefleet_user: Root", {"servefleet_user": "Root"}, "'servefleet_user' = 'Root'"),
        case(
            "servefleet_user: 33 characters",
            {"servefleet_user": "s" * 33},
            "'servefleet_user' = 'sssss",
        ),
        case(
            "servefleet_user: shell characters", {"servefleet_user": "svc;id"}, "'servefleet_user'"
        ),
        case("model_repo: org/..", {"model_repo": "org/.."}, "'model_repo' = 'org/..'"),
        case("model_repo: ../../etc", {"model_repo": "../../etc"}, "'model_repo'"),
        case("model_revision: a newline", {"model_revision": "main\nx"}, "'model_revision'"),
        case("model_revision: ../", {"model_revision": "../../x"}, "'model_revision'"),
        case("model_revision: a space", {"model_revision": "main branch"}, "'model_revision'"),
        case(
            "model_revision: 5,000 characters",
            {"model_revision": "a" * 5000},
            "at most 128 characters",
        ),
        case(
            "model_revision: 129 characters",
            {"model_revision": "v" + "1" * 128},
            "'model_revision'",
        ),
        case("served_model_name: a space", {"served_model_name": "a b"}, "'served_model_name'"),
        case(
            "served_model_name: a directive",
            {"served_model_name": "x\nExecStartPre=/bin/sh"},
            "'served_model_name'",
        ),
        case(
            "vllm_extra_args: a newline",
            {"vllm_extra_args": ["--x\nExecStartPre=/bin/sh"]},
            "'vllm_extra_args'",
        ),
        case("vllm_extra_args: a quote", {"vllm_extra_args": ["--x='a"]}, "'vllm_extra_args'"),
        case(
            "llamacpp_server_args: a space",
            {"llamacpp_server_args": ["a;b c"]},
            "'llamacpp_server_args'",
            base=RTX,
            groups=("rtx4090",),
            recipe="serve_q4_llamacpp",
        ),
        case(
            "llamacpp_cmake_flags: a second flag in a value",
            {"llamacpp_cmake_flags": {"GGML_CUDA": "ON -DX=1"}},
            "'llamacpp_cmake_flags'",
            base=RTX,
            groups=("rtx4090",),
            recipe="serve_q4_llamacpp",
        ),
        case(
            "llamacpp_git_url: a shell command",
            {"llamacpp_git_url": "https://x/y;rm -rf /"},
            "'llamacpp_git_url'",
            base=RTX,
            groups=("rtx4090",),
            recipe="serve_q4_llamacpp",
        ),
        case(
            "model_file: ../",
            {"model_file": "../../etc/passwd.gguf"},
            "'model_file'",
            base=RTX,
            groups=("rtx4090",),
            recipe="serve_q4_llamacpp",
        ),
        case("hf_endpoint: a newline", {"hf_endpoint": "http://x\nHost: y"}, "'hf_endpoint'"),
        case("expected_arch: shell", {"expected_arch": "x86_64; reboot"}, "'expected_arch'"),
        case("service_port: a boolean", {"service_port": True}, "'service_port' = True (bool)"),
        case("service_port: 0", {"service_port": 0}, "'service_port' = 0"),
        case(
            "python_interpreter: a command",
            {"python_interpreter": {"debian": "python3 -c x"}},
            "'python_interpreter'",
        ),
        case(
            "an API on every interface without a key",
            {"service_host": "0.0.0.0"},
            "key 'api_key_file' is missing: the API binds 0.0.0.0",
        ),
        case(
            "the testbed's executable on a real host",
            {"vllm_executable": "/tmp/x"},
            "key 'vllm_executable' is testbed-only",
        ),
        case("a misspelt key", {"serivce_port": 8001}, "(did you mean service_port?)"),
        case("depot source without a depot", {"model_source": "depot"}, "'depot_host' is missing"),
        case(
            "a performance gate that checks nothing",
            {"perf_gate_decode_drop_pct": None, "perf_gate_ttft_rise_pct": None},
            "are both None: a gate that checks nothing would pass any release",
        ),
        harmless(
            CATEGORY,
            "served_model_name with % and $",
            "the unit holds it escaped (%% and $$), with the same directives as a clean one",
            escaped_name_is_one_word,
        ),
    ]
)


# Sizes (core/sizes.py): one set of forms everywhere; what is not a whole byte count in binary
# units is refused, naming the key and the forms.
CASES += [
    case(
        "kv_cache_memory_bytes: 8GB (decimal?)",
        {"kv_cache_memory_bytes": "8GB"},
        "'kv_cache_memory_bytes' = '8GB'",
    ),
    case(
        "kv_cache_memory_bytes: 8g",
        {"kv_cache_memory_bytes": "8g"},
        "'kv_cache_memory_bytes' = '8g'",
    ),
    case(
        "min_free_disk_bytes: 1.1K (not whole bytes)",
        {"min_free_disk_bytes": "1.1K"},
        "'min_free_disk_bytes' = '1.1K'",
    ),
    case("min_free_disk_bytes: 2P (over 1 PiB)", {"min_free_disk_bytes": "2P"}, "from 0 to 1 PiB"),
    case(
        "download_margin_bytes: 8 GiB (a space)",
        {"download_margin_bytes": "8 GiB"},
        "8G = 8GiB, 512M, 1.5GiB",
    ),
    case(
        "memory_overhead_bytes: -4G",
        {"memory_overhead_bytes": "-4G"},
        "'memory_overhead_bytes' = '-4G'",
    ),
]
