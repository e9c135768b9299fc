"""One node layout: every path servefleet uses on a node comes from NodeLayout."""

from servefleet.core.layout import NodeLayout, api_url, check_host


def test_default_tree():
    lay = NodeLayout.of({"servefleet_root": "/opt/servefleet", "servefleet_user": "servefleet"})
    assert lay.tools_venv == "/opt/servefleet/tools/venv"
    assert lay.engine_venv("vllm", "0.24.0") == "/opt/servefleet/venvs/vllm-0.24.0"
    assert lay.llama_prefix("b9785-abc") == "/opt/servefleet/llama.cpp/b9785-abc"
    assert lay.llama_server("b9785-abc") == "/opt/servefleet/llama.cpp/b9785-abc/bin/llama-server"
    assert (
        lay.model_dir("Qwen/Qwen-AgentWorld-35B-A3B", "main")
        == "/opt/servefleet/models/Qwen--Qwen-AgentWorld-35B-A3B/main"
    )
    assert lay.api_key_file == "/opt/servefleet/etc/api-key"
    assert lay.releases_file == "/opt/servefleet/state/releases.json"
    assert lay.depot_dir == "/opt/servefleet/depot"
    assert lay.unit_path("servefleet-vllm.service") == "/etc/systemd/system/servefleet-vllm.service"


def test_revisions_are_their_own_directories():
    lay = NodeLayout("/opt/servefleet")
    a, b = lay.model_dir("org/m", "a" * 40), lay.model_dir("org/m", "v2")
    assert a != b and a.startswith(lay.models_dir + "/") and b.startswith(lay.models_dir + "/")
    assert lay.model_dir("org/m", "refs/pr/1").endswith("/org--m/refs~pr~1")  # one component


def test_a_moved_root_moves_everything_and_the_depot_follows():
    lay = NodeLayout.of({"servefleet_root": "/srv/sf", "servefleet_user": "svc"})
    for path in (
        lay.tools_venv,
        lay.api_key_file,
        lay.state_dir,
        lay.models_dir,
        lay.depot_dir,
        lay.llama_current,
        lay.bin("x"),
        lay.cache_dir,
    ):
        assert path.startswith("/srv/sf/")
    apart = NodeLayout.of(
        {"servefleet_root": "/srv/sf", "models_root": "/data/models", "depot_store": "/data/depot"}
    )
    assert apart.model_dir("o/n", "main") == "/data/models/o--n/main"
    assert apart.depot_model_dir("o/n", "a" * 40) == f"/data/depot/o--n/{'a' * 40}"


def test_the_service_writes_only_its_cache_and_the_models():
    lay = NodeLayout("/opt/servefleet")
    assert set(lay.writable_dirs) == {"/opt/servefleet/cache", "/opt/servefleet/models"}
    assert not set(lay.tree) & set(lay.writable_dirs)


def test_checks_reach_the_api_on_the_node():
    assert check_host("0.0.0.0") == "127.0.0.1" and check_host("::") == "127.0.0.1"
    assert check_host("::1") == "[::1]" and check_host("10.0.0.5") == "10.0.0.5"
    assert api_url({"service_host": "::1", "service_port": 8000}) == "http://[::1]:8000"
