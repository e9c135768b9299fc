"""The health check of a serving node, for both engines: files/health/health.py run on the node.

Used after a (re)start (guarded with `_if=`) and as a rollout's gate (servefleet.verbs.rollout
runs the same command line). For vLLM the engine's KV-cache log lines of this start are compared
with plan-kv's numbers, read from the node's config.json when the check runs.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from servefleet.core.vllm import kv_compared, kv_expectation
from servefleet.operations.vllm_preflight import read_json_on_node


def argv(
    script: str,
    python: str,
    url: str,
    model: str,
    unit: str,
    key_file: str | None = None,
    timeout_s: int = 600,
    settle_s: int = 0,
    expect_stopped: bool = False,
    kv_config: str | None = None,
    kv_data: dict | None = None,
    engine_version: str | None = None,
    read_config: bool = True,
    kv_user: str = "servefleet",
) -> list[str]:
    """The health script's command line for this host (read_config: read config.json now)."""
    args = [
        python,
        "-I",
        script,
        "--url",
        url,
        "--model",
        model,
        "--unit",
        unit,
        "--timeout",
        str(int(timeout_s)),
        "--settle",
        str(int(settle_s)),
    ]
    if expect_stopped:
        return args + ["--expect-stopped"]
    if key_file:
        args += ["--key-file", key_file]
    if kv_config and kv_data is not None:
        if engine_version and not kv_compared(engine_version):
            args += [
                "--kv-not-compared",
                f"plan-kv is not checked against vLLM {engine_version} on a GPU",
            ]
        else:
            config = read_json_on_node(kv_config, kv_user) if read_config else None
            expected = kv_expectation(config, kv_data) if isinstance(config, dict) else None
            if expected:
                args += [
                    "--expect-tokens",
                    str(expected[0]),
                    "--expect-concurrency",
                    expected[1],
                    "--max-model-len",
                    str(kv_data["max_model_len"]),
                ]
            elif kv_data.get("kv_cache_memory_bytes") is None:
                args += ["--kv-not-compared", "vLLM sizes its pool from free memory"]
    return args


@operation()
def check(
    script: str,
    python: str,
    url: str,
    model: str,
    unit: str,
    key_file: str | None = None,
    timeout_s: int = 600,
    settle_s: int = 0,
    expect_stopped: bool = False,
    kv_config: str | None = None,
    kv_data: dict | None = None,
    engine_version: str | None = None,
    kv_user: str = "servefleet",
):
    """
    Wait for /health, compare the KV log lines (vLLM), run one chat completion, settle.

    + script: files/health/health.py on the node
    + python: the interpreter that runs it (stdlib only)
    + url: the API's base URL as seen from the node, e.g. http://127.0.0.1:8000
    + model: the served model name
    + unit: the systemd unit serving it (its state and journal are read)
    + key_file: the node's API key file (read by the script; never on a command line)
    + timeout_s: how long a start may take
    + settle_s: how long the service must then stay healthy
    + expect_stopped: the data says the service is stopped: check that, nothing else
    + kv_config: vLLM only: the checkpoint's config.json on the node (plan-kv's input)
    + kv_data: vLLM only: max_model_len, kv_cache_memory_bytes, kv_block_alignment
    + engine_version: vLLM only: KV lines are compared only for versions checked on a GPU
    + kv_user: vLLM only: the service user, as whom config.json is read (the engine can write
      the models root); releases recorded before it was kept use the default user

    Always runs a command when called: guard it with ``_if=``.

    **Example:**

    .. code:: python

        health.check(script="/opt/servefleet/bin/servefleet-health", python="python3",
                     url="http://127.0.0.1:8080", model="qwen", unit="servefleet-llama.service",
                     _if=svc.started)
    """
    yield " ".join(
        shlex.quote(a)
        for a in argv(
            script,
            python,
            url,
            model,
            unit,
            key_file,
            timeout_s,
            settle_s,
            expect_stopped,
            kv_config,
            kv_data,
            engine_version,
            read_config=host.state.is_executing,
            kv_user=kv_user,
        )
    )
