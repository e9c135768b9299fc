"""The health check of a serving node, for every engine: files/health/health.py run on the node.

Used after a (re)start (guarded with `_if=`) and as a rollout's gate (servefleet.verbs.healthgate
runs the same command line). A release records its gate's arguments (recipes/serving.py
gate_args): the generic ones below, and what its engine adds (a vLLM gate's KV comparison),
which the engine turns into arguments of its own (Engine.health_args).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping

from pyinfra import host
from pyinfra.api import operation

# The gate's arguments every engine's check takes; the rest of a recorded gate is its engine's.
GENERIC_KEYS = (
    "script",
    "python",
    "url",
    "model",
    "unit",
    "key_file",
    "timeout_s",
    "settle_s",
    "expect_stopped",
)


def split_gate(gate: Mapping) -> tuple[dict, dict]:
    """(the generic arguments, the engine's) of a recorded gate."""
    generic = {k: v for k, v in gate.items() if k in GENERIC_KEYS}
    return generic, {k: v for k, v in gate.items() if k not in GENERIC_KEYS}


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
    extra: Callable[[], list[str]] = list,
) -> list[str]:
    """The health script's command line for this host; extra: () -> the engine's arguments
    (called only when the check is one of a running service)."""
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
    return args + extra()


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
    engine_args: Callable[[bool], list[str]] = lambda on_node: [],
):
    """
    Wait for /health, compare what the engine adds (vLLM: its KV log lines), run one chat
    completion, settle.

    + script: files/health/health.py on the node
    + python: the interpreter that runs it (stdlib only)
    + url: the API's base URL as seen from the node, e.g. http://127.0.0.1:8000
    + model: the served model name
    + unit: the systemd unit serving it (its state and journal are read)
    + key_file: the node's API key file (read by the script; never on a command line)
    + timeout_s: how long a start may take
    + settle_s: how long the service must then stay healthy
    + expect_stopped: the data says the service is stopped: check that, nothing else
    + engine_args: (read on the node now) -> the engine's own arguments (Engine.health_args)

    Always runs a command when called: guard it with ``_if=``.

    **Example:**

    .. code:: python

        health.check(script="/opt/servefleet/bin/servefleet-health", python="python3",
                     url="http://127.0.0.1:8080", model="qwen", unit="servefleet-llama.service",
                     _if=svc.started)
    """
    executing = bool(host.state.is_executing)
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
            extra=lambda: engine_args(executing),
        )
    )
