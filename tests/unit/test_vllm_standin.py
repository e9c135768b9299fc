"""The testbed's vLLM engine stand-in (servefleet_dev/standin/vllm_standin.py), run as a program.

Each test starts it as the unit would (`python3 -I vllm_standin.py serve MODEL ...` with
VIRTUAL_ENV pointing at a venv that holds a vllm-X.dist-info) against a model dir whose
config.json is the H200 probe's checkpoint's, on a free 127.0.0.1 port, and always kills it.
"""

from __future__ import annotations

import ast
import hashlib
import http.client as httpclient
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from servefleet_dev.standin import install as standin_install, vllm_standin
from servefleet_dev.testing.tiny_models import build_tiny_checkpoint

PROGRAM = Path(vllm_standin.__file__)
FIXTURES = standin_install.FIXTURES
INDEX = json.loads((FIXTURES / "index.json").read_text())
PROBE_CONFIG_SHA = "de6a25f5380f35dfbd5c36b13931e88448c579f578fc7a65a356c9d14e5bde33"
GIB = 1 << 30
NAME = "Qwen/Qwen-AgentWorld-35B-A3B"  # the served name of the HTTP tests' recording (0.24.0)
# (max_model_len, kv bytes) -> the real engine's KV lines on the H200 (same for 0.24.0, 0.26.0)
KV_LINES = {
    (4096, 2 * GIB): (
        "GPU KV cache size: 2,957,684 tokens",
        "Maximum concurrency for 4,096 tokens per request: 722.09x",
    ),
    (3000, 1 * GIB): (
        "GPU KV cache size: 1,323,666 tokens",
        "Maximum concurrency for 3,000 tokens per request: 441.22x",
    ),
}


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_venv(root: Path, version: str) -> Path:
    # The layout a venv made by this interpreter has (the stand-in reads any python3.X).
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    meta = site / f"vllm-{version}.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\nSummary: x\n\nbody\n")
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A checkpoint dir with the probe's config.json (no weights: the stand-in reads none)."""
    built = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), visual=False, mtp=True)
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_bytes((built / "config.json").read_bytes())
    return model


def recorded(version: str, max_model_len, kv) -> dict:
    """The `non-default args` the H200 recording for this combination was started with ({}
    when none is recorded)."""
    for rec in INDEX["recordings"]:
        if (rec["vllm_version"], rec["max_model_len"], rec["kv_cache_memory_bytes"]) == (
            version,
            max_model_len,
            kv,
        ):
            return vllm_standin.recorded_args(str(FIXTURES / rec["file"]))
    return {}


def serve_argv(
    model: Path, port: int, max_model_len=4096, kv=2 * GIB, extra=(), version="0.24.0"
) -> list[str]:
    """The unit's argv, with the served name and eager mode of the recording it replays (the
    stand-in refuses a recording made with other arguments)."""
    rec = recorded(version, max_model_len, kv)
    name = rec.get("served_model_name", ["tiny"])[0]
    extra = (["--enforce-eager"] if rec.get("enforce_eager") else []) + list(extra)
    argv = [
        "serve",
        str(model),
        "--served-model-name",
        name,
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--language-model-only",
    ]
    if kv is not None:
        argv += ["--kv-cache-memory-bytes", str(kv)]
    return argv + list(extra)


class Run:
    """One stand-in process; stdout/stderr go to files (no pipe can fill up)."""

    def __init__(
        self,
        tmp: Path,
        argv: list[str],
        version="0.24.0",
        env=None,
        program=PROGRAM,
        data: Path | None = FIXTURES,
    ):
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        venv = tmp / f"venv-{version}"
        if not venv.exists():
            make_venv(venv, version)
        full_env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("VLLM_API_KEY", vllm_standin.DATA_ENV, vllm_standin.FAIL_ENV)
        }
        full_env.update(
            {"VIRTUAL_ENV": str(venv), vllm_standin.FAIL_ENV: str(tmp / "no-fail-versions")}
        )
        if data is not None:
            full_env[vllm_standin.DATA_ENV] = str(data)
        full_env.update(env or {})
        self.out_path, self.err_path = tmp / "stdout", tmp / "stderr"
        cmd = [sys.executable, "-I", str(program)] if program.suffix == ".py" else [str(program)]
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [*cmd, *argv], stdout=out, stderr=err, env=full_env, stdin=subprocess.DEVNULL
            )

    def wait(self, timeout=30) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def call(port, method, path, body=None, headers=None, raw=False, timeout=30):
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    hdrs.update(headers or {})
    conn.request(method, path, data, hdrs)
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    if raw:
        return resp.status, payload
    return resp.status, (json.loads(payload) if payload else None)


def wait_healthy(run: Run, port: int, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.proc.poll() is not None:
            raise AssertionError(
                f"stand-in exited {run.proc.returncode}: {run.stderr}\n{run.stdout[-2000:]}"
            )
        try:
            if call(port, "GET", "/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("no /health 200")


@pytest.fixture
def started(tmp_path, model_dir):
    """started(version=..., max_model_len=..., kv=..., extra=..., env=...) -> (run, port)."""
    runs = []

    def start(version="0.24.0", max_model_len=4096, kv=2 * GIB, extra=(), env=None):
        port = free_port()
        run = Run(
            tmp_path / f"run{len(runs)}",
            serve_argv(model_dir, port, max_model_len, kv, extra, version),
            version=version,
            env=env,
        )
        runs.append(run)
        wait_healthy(run, port)
        return run, port

    yield start
    for run in runs:
        run.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    """One stand-in (0.24.0, 3000 / 1 GiB, no key) shared by the HTTP contract tests."""
    port = free_port()
    run = Run(tmp_path_factory.mktemp("server"), serve_argv(model_dir, port, 3000, GIB))
    try:
        wait_healthy(run, port)
        yield port
    finally:
        run.kill()


def sse_chunks(payload: bytes) -> list:
    events = [line[len(b"data: ") :] for line in payload.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return [json.loads(e) for e in events[:-1]]


# ------------------------------------------------------------------------------------------
# The program file and its data
# ------------------------------------------------------------------------------------------


def test_program_is_one_stdlib_only_file():
    source = PROGRAM.read_text()
    assert source.splitlines()[0] == "#!/usr/bin/python3 -I"
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_recorded_checkpoint_config(tmp_path):
    """The probe served build_tiny_checkpoint(visual=False, mtp=True); mtp=False has the same config.json."""
    shas = {
        mtp: hashlib.sha256(
            (
                build_tiny_checkpoint(tmp_path / str(mtp), visual=False, mtp=mtp) / "config.json"
            ).read_bytes()
        ).hexdigest()
        for mtp in (True, False)
    }
    assert shas == {True: PROBE_CONFIG_SHA, False: PROBE_CONFIG_SHA}
    assert {rec["config_sha256"] for rec in INDEX["recordings"]} == {PROBE_CONFIG_SHA}


@pytest.mark.parametrize("rec", INDEX["recordings"], ids=lambda r: r["file"])
def test_index_matches_each_recording(rec):
    text = (FIXTURES / rec["file"]).read_text()
    args = re.search(r"non-default args: (\{.*\})", text).group(1)
    assert f"'max_model_len': {rec['max_model_len']}," in args
    assert f"'kv_cache_memory_bytes': {rec['kv_cache_memory_bytes']}," in args
    assert f"Initializing a V1 LLM engine (v{rec['vllm_version']})" in text
    assert f"GPU KV cache size: {rec['kv_cache_tokens']:,} tokens" in text
    assert (
        f"Maximum concurrency for {rec['max_model_len']:,} tokens per request: "
        f"{rec['max_concurrency']}"
    ) in text
    assert vllm_standin.STARTUP_DONE in text


HELP = {entry["vllm_version"]: FIXTURES / entry["file"] for entry in INDEX["serve_help"]}


def test_help_text_flags():
    flags = vllm_standin.option_strings(HELP["0.24.0"].read_text())
    assert len(flags) > 250
    for flag in (
        "-h",
        "--help",
        "--enforce-eager",
        "--no-enforce-eager",
        "--language-model-only",
        "--no-language-model-only",
        "--disable-log-stats",
    ):
        assert flags[flag] == "0", flag
    for flag in (
        "--max-model-len",
        "--kv-cache-memory-bytes",
        "--host",
        "--port",
        "--dtype",
        "--gdn-prefill-backend",
        "--config-format",
        "-cc",
        "--compilation-config",
    ):
        assert flags[flag] == "1", flag
    assert flags["--served-model-name"] == flags["--api-key"] == "+"
    assert flags["--hf-token"] == "?"
    assert "--json-arg" not in flags  # the JSON tip's example lines are not options
    assert not [f for f in flags if not re.fullmatch(r"--?[a-z0-9][a-z0-9-]*", f)]


# ------------------------------------------------------------------------------------------
# Start: replay, refusals, the failure switch
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.24.0", "0.26.0"])
@pytest.mark.parametrize("max_model_len,kv", list(KV_LINES))
def test_replays_the_recorded_startup(started, version, max_model_len, kv):
    run, port = started(version=version, max_model_len=max_model_len, kv=kv)
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 0
    out = run.stdout
    for line in KV_LINES[(max_model_len, kv)]:
        assert line in out
    assert f"Initializing a V1 LLM engine (v{version})" in out
    rec = next(
        r
        for r in INDEX["recordings"]
        if r["vllm_version"] == version
        and r["max_model_len"] == max_model_len
        and r["kv_cache_memory_bytes"] == kv
    )
    recorded = vllm_standin.startup_lines(FIXTURES / rec["file"])
    assert recorded[-1].endswith("Application startup complete.")
    lines = out.splitlines()
    assert lines[0].startswith("vllm stand-in: replaying") and rec["file"] in lines[0]
    replayed = [ln for ln in lines if not ln.startswith("vllm stand-in:")][: len(recorded)]
    assert replayed == recorded  # verbatim, in order
    assert run.stderr == ""


# (A version without a captured help text is refused before this: see
# test_each_version_is_checked_against_its_own_flags.)
@pytest.mark.parametrize("case", ["max_model_len", "kv", "no_kv", "config"])
def test_unrecorded_combination_is_refused(tmp_path, model_dir, case):
    model, version, mml, kv = model_dir, "0.24.0", 4096, 2 * GIB
    if case == "max_model_len":
        mml = 2048
    elif case == "kv":
        kv = 3 * GIB
    elif case == "no_kv":
        kv = None
    else:
        model = tmp_path / "other-model"
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "other"}\n')
    run = Run(tmp_path / "run", serve_argv(model, free_port(), mml, kv), version=version)
    assert run.wait() == 1
    assert run.stdout == ""  # nothing replayed
    err = run.stderr.splitlines()
    assert len(err) == 1, err
    line = err[0]
    sha = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
    assert f"vLLM {version}" in line and sha in line
    assert f"max_model_len {mml}" in line
    assert f"kv_cache_memory_bytes {'unset' if kv is None else kv}" in line
    assert "recorded: " in line
    for rec in INDEX["recordings"]:
        assert (
            f"vLLM {rec['vllm_version']} config {PROBE_CONFIG_SHA[:12]} max_model_len "
            f"{rec['max_model_len']} kv_cache_memory_bytes {rec['kv_cache_memory_bytes']}"
        ) in line


@pytest.mark.parametrize(
    "extra,named",
    [
        (["--foo"], "--foo"),
        (["--foo=1", "--enforce-eager"], "--foo"),
        (["--max-model"], "--max-model"),  # abbreviations are not in the help text either
        (["--language-model-only", "--no-such-flag", "x"], "--no-such-flag"),
    ],
)
def test_unknown_flag_is_refused_before_anything(tmp_path, model_dir, extra, named):
    run = Run(tmp_path / "run", serve_argv(model_dir, free_port(), extra=extra))
    assert run.wait() == 2
    assert run.stdout == ""
    err = run.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("vllm serve: error: unrecognized arguments: ")
    assert named in err[0].split(": ")[-1].split()


def test_real_vllm_flags_are_parsed_then_compared_with_the_recording(tmp_path, model_dir):
    """Flags from the help text (both spellings of booleans, `_` for `-`, dotted JSON) parse;
    those the recording was not started with are refused by name: its journal would show
    another engine's start. --gdn-prefill-backend is the probe's own (index: probe_only_args)."""
    run = Run(
        tmp_path / "run",
        serve_argv(
            model_dir,
            free_port(),
            extra=[
                "--gdn-prefill-backend",
                "triton",
                "--enforce-eager",
                "--no-enable-log-requests",
                "--max_num_seqs",
                "8",
                "-cc.mode=none",
                "--disable-log-stats",
            ],
        ),
    )
    assert run.wait() == 1 and run.stdout == ""  # nothing replayed
    (line,) = run.stderr.strip().splitlines()
    assert (
        "unrecognized" not in line
        and "0.24.0_4096_2GiB.vllm.log was recorded with other arguments than this argv" in line
    )
    for differs in (
        "enforce_eager: argv True, recorded 'unset'",
        "max_num_seqs: argv '8'",
        "no_enable_log_requests: argv True",
        "disable_log_stats: argv True",
    ):
        assert differs in line
    assert "gdn_prefill_backend" not in line


def test_a_recording_made_with_another_served_name_is_refused(tmp_path, model_dir):
    argv = serve_argv(model_dir, free_port())
    argv[argv.index("--served-model-name") + 1] = "tiny"
    run = Run(tmp_path / "run", argv)
    assert run.wait() == 1 and run.stdout == ""
    assert (
        "served_model_name: argv ['tiny'], recorded ['Qwen/Qwen-AgentWorld-35B-A3B']" in run.stderr
    )


def test_the_probe_only_flag_is_accepted(started):
    run, port = started(extra=["--gdn-prefill-backend", "triton"])
    assert call(port, "GET", "/health")[0] == 200


@pytest.mark.parametrize("version", ["0.24.0", "0.26.0"])
def test_help_prints_the_captured_text_of_the_installed_version(tmp_path, version):
    run = Run(tmp_path / "run", ["serve", "--help=all"], version=version)
    assert run.wait() == 0
    assert run.stdout == HELP[version].read_text()


def test_each_version_is_checked_against_its_own_flags(tmp_path, model_dir):
    """A flag one version has and the other lacks: accepted or refused by the installed one."""
    flags = {v: set(vllm_standin.option_strings(p.read_text())) for v, p in HELP.items()}
    only_026 = sorted(flags["0.26.0"] - flags["0.24.0"])
    assert only_026, "0.26.0 adds flags to 0.24.0's"
    flag = next(f for f in only_026 if f.startswith("--"))
    refused = Run(tmp_path / "old", ["serve", str(model_dir), flag, "x"], version="0.24.0")
    assert refused.wait() == 2 and f"unrecognized arguments: {flag}" in refused.stderr
    unknown = Run(tmp_path / "new", ["serve", str(model_dir)], version="0.25.0")
    assert unknown.wait() == 1
    assert (
        "no `vllm serve --help=all` of vLLM 0.25.0 is captured (captured: 0.24.0, 0.26.0)"
        in unknown.stderr
    )


def test_fail_versions_switch_crashes_every_start(tmp_path, model_dir):
    fail = tmp_path / "fail-versions"
    fail.write_text("0.26.0\n0.24.0\n")
    recorded = (FIXTURES / "0.24.0_4096_2GiB.vllm.log").read_text().splitlines()
    for attempt in range(2):  # every start, as systemd's Restart=on-failure would see it
        port = free_port()
        run = Run(
            tmp_path / f"run{attempt}",
            serve_argv(model_dir, port),
            env={vllm_standin.FAIL_ENV: str(fail)},
        )
        assert run.wait() == 1
        out = run.stdout
        lines = out.splitlines()
        assert lines[0].startswith("vllm stand-in: ") and str(fail) in lines[0]
        assert lines[1:4] == recorded[:3]  # some recorded startup lines first
        assert "GPU KV cache size" not in out and "Application startup complete." not in out
        assert "EngineCore failed to start." in out and "Traceback (most recent call last):" in out
        assert re.search(r"RuntimeError: simulated engine start failure .*0\.24\.0", out)
        with pytest.raises(OSError):
            call(port, "GET", "/health", timeout=2)


def test_fail_versions_lists_another_version(started, tmp_path):
    fail = tmp_path / "fail-versions"
    fail.write_text("0.26.0\n")
    run, port = started(env={vllm_standin.FAIL_ENV: str(fail)})
    assert call(port, "GET", "/health")[0] == 200


# ------------------------------------------------------------------------------------------
# HTTP contract (vLLM 0.24.0)
# ------------------------------------------------------------------------------------------


def test_health_and_models(server):
    status, body = call(server, "GET", "/health", raw=True)
    assert (status, body) == (200, b"")
    status, models = call(server, "GET", "/v1/models")
    assert status == 200 and models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == NAME and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 3000
    assert call(server, "GET", "/version")[1] == {"version": "0.24.0"}
    assert call(server, "GET", "/nope") == (404, {"detail": "Not Found"})
    assert call(server, "GET", "/v1/chat/completions")[0] == 405


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hello world"},
        {"model": NAME, "prompt": "hello world"},
        {"content": "hello world", "prompt": "hello world"},
    ],
)
def test_tokenize(server, body):
    status, answer = call(server, "POST", "/tokenize", body)
    assert status == 200
    assert answer["count"] == len(answer["tokens"]) == len("hello world")
    assert answer["max_model_len"] == 3000
    assert answer["tokens"] == list(b"hello world")
    assert call(server, "POST", "/detokenize", {"tokens": answer["tokens"]})[1] == {
        "prompt": "hello world"
    }


def test_chat_non_streaming(server):
    messages = [{"role": "user", "content": "Say hello in one word."}]
    count = call(server, "POST", "/tokenize", {"model": NAME, "messages": messages})[1]["count"]
    status, answer = call(
        server,
        "POST",
        "/v1/chat/completions",
        {"model": NAME, "messages": messages, "max_tokens": 16, "temperature": 0},
    )
    assert status == 200 and answer["object"] == "chat.completion" and answer["model"] == NAME
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == vllm_standin.GREEDY_TEXT[:16]
    assert answer["usage"]["prompt_tokens"] == count
    assert answer["usage"]["completion_tokens"] == 16
    assert answer["usage"]["total_tokens"] == count + 16
    # Deterministic; without max_tokens it ends by itself ("stop").
    again = call(server, "POST", "/v1/chat/completions", {"messages": messages, "temperature": 0})[
        1
    ]
    assert again["choices"][0]["finish_reason"] == "stop"
    assert again["choices"][0]["message"]["content"] == vllm_standin.GREEDY_TEXT
    assert again["usage"]["completion_tokens"] == len(vllm_standin.GREEDY_TEXT.encode())
    # ignore_eos runs to max_tokens; temperature > 0 with a seed is deterministic too.
    long = call(
        server,
        "POST",
        "/v1/chat/completions",
        {"messages": messages, "temperature": 0, "ignore_eos": True, "max_tokens": 100},
    )[1]
    assert (
        long["usage"]["completion_tokens"] == 100
        and long["choices"][0]["finish_reason"] == "length"
    )
    hot = [
        call(
            server,
            "POST",
            "/v1/chat/completions",
            {"messages": messages, "temperature": 0.8, "seed": 7},
        )[1]
        for _ in range(2)
    ]
    assert hot[0]["choices"][0]["message"] == hot[1]["choices"][0]["message"]
    assert hot[0]["choices"][0]["message"]["content"] != vllm_standin.GREEDY_TEXT


def test_chat_streaming_with_usage(server):
    messages = [{"role": "user", "content": "hello " * 50}]
    count = call(server, "POST", "/tokenize", {"messages": messages})[1]["count"]
    status, payload = call(
        server,
        "POST",
        "/v1/chat/completions",
        {
            "model": NAME,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "ignore_eos": True,
            "max_tokens": 64,
        },
        raw=True,
    )
    assert status == 200
    chunks = sse_chunks(payload)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(content) == 64 and all(content)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": count,
        "completion_tokens": 64,
        "total_tokens": count + 64,
    }
    # Without include_usage: no usage chunk, still [DONE].
    plain = sse_chunks(
        call(
            server,
            "POST",
            "/v1/chat/completions",
            {"messages": messages, "stream": True, "temperature": 0, "max_tokens": 4},
            raw=True,
        )[1]
    )
    assert plain[-1]["choices"][0]["finish_reason"] == "length"
    assert not any(c.get("usage") for c in plain)


def test_streaming_and_health_at_once(server):
    """A long stream does not hold up /health (threaded server)."""
    result = {}

    def stream():
        result["status"], result["payload"] = call(
            server,
            "POST",
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "temperature": 0,
                "ignore_eos": True,
                "max_tokens": 600,
            },
            raw=True,
        )

    thread = threading.Thread(target=stream)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()
    started = time.monotonic()
    assert call(server, "GET", "/health")[0] == 200
    assert time.monotonic() - started < 0.5
    thread.join(30)
    assert (
        result["status"] == 200 and len(sse_chunks(result["payload"])) == 601
    )  # role + 600 tokens


def test_request_errors(server):
    status, answer = call(
        server,
        "POST",
        "/v1/chat/completions",
        {"model": "other", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404 and answer["error"]["type"] == "NotFoundError"
    status, answer = call(
        server,
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3000},
    )
    assert status == 400 and "maximum context length is 3000 tokens" in answer["error"]["message"]
    status, answer = call(
        server, "POST", "/tokenize", {"prompt": "x"}, headers={"Content-Type": "text/plain"}
    )
    assert status == 400 and answer["error"]["code"] == 400


def test_api_key(started):
    run, port = started(env={"VLLM_API_KEY": "sekrit"})
    good, bad = {"Authorization": "Bearer sekrit"}, {"Authorization": "Bearer nope"}
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    # Guarded: every path under /v1 (and /v2, /inference), whatever the method or route.
    for method, path, body in [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}),
        ("GET", "/v1/no-such-route", None),
        ("POST", "/inference/v1/generate", {}),
    ]:
        assert call(port, method, path, body) == (401, {"error": "Unauthorized"}), path
        assert call(port, method, path, body, headers=bad)[0] == 401, path
        assert call(port, method, path, body, headers={"Authorization": "sekrit"})[0] == 401, path
    assert call(port, "GET", "/v1/models", headers=good)[0] == 200
    assert call(port, "GET", "/v1/models", headers={"Authorization": "bearer sekrit"})[0] == 200
    assert call(port, "POST", "/v1/chat/completions", chat, headers=good)[0] == 200
    # Open, as in vLLM 0.24.0: /health, /tokenize, /version, /ping.
    assert call(port, "GET", "/health")[0] == 200
    assert call(port, "POST", "/tokenize", {"prompt": "x"})[0] == 200
    assert call(port, "GET", "/version")[0] == 200
    assert call(port, "GET", "/ping")[0] == 200


def test_api_key_flag_takes_precedence(started):
    run, port = started(extra=["--api-key", "from-flag"], env={"VLLM_API_KEY": "from-env"})
    assert call(port, "GET", "/v1/models", headers={"Authorization": "Bearer from-env"})[0] == 401
    assert call(port, "GET", "/v1/models", headers={"Authorization": "Bearer from-flag"})[0] == 200


# ------------------------------------------------------------------------------------------
# install(): one executable plus its data dir
# ------------------------------------------------------------------------------------------


def test_install(tmp_path, model_dir):
    dest = tmp_path / "opt" / "standin"
    exe = standin_install.install(dest)
    exe = standin_install.install(dest)  # idempotent
    data = dest / vllm_standin.DATA_DIR_NAME
    assert exe == dest / standin_install.EXECUTABLE_NAME
    assert exe.read_bytes() == PROGRAM.read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == sorted([exe.name, data.name])
    assert sorted(p.name for p in data.iterdir()) == sorted(standin_install.data_files())
    assert stat.S_IMODE(exe.stat().st_mode) == 0o755
    assert stat.S_IMODE(data.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in data.iterdir()} == {0o644}
    if os.geteuid() == 0:
        assert {(p.stat().st_uid, p.stat().st_gid) for p in [dest, exe, data, *data.iterdir()]} == {
            (0, 0)
        }
    # Run through its shebang, finding its data beside itself (no data env var).
    run = Run(tmp_path / "run", serve_argv(model_dir, free_port(), 2048), program=exe, data=None)
    assert run.wait() == 1
    assert "recorded: vLLM 0.24.0" in run.stderr
    port = free_port()
    run = Run(tmp_path / "run2", serve_argv(model_dir, port), program=exe, data=None)
    try:
        wait_healthy(run, port)
        assert "722.09x" in run.stdout
    finally:
        run.kill()
