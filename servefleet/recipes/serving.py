"""The steps every serving recipe shares: the API key on the node, the health gate's arguments
and the health step that runs it after a (re)start.

A release records its gate (servefleet.recipes.releases), so a rollout gates a host, rolled back
or not, with the check of the release it serves; the arguments are built here once for every
engine, the engine adds its own (vLLM: the KV comparison) and turns them into arguments of the
check (Engine.health_args).
"""

from __future__ import annotations

import posixpath

from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import File, Sha1File, Sha256File

from servefleet.core.declarations import Engine
from servefleet.core.layout import NodeLayout, api_url
from servefleet.core.secrets import read_secret
from servefleet.facts.node import PathStat
from servefleet.facts.releases import NodeChecks, NodeReleases, RunningRelease
from servefleet.facts.systemd import UnitState
from servefleet.operations import (
    files,
    health as health_ops,
    metrics as metrics_ops,
    releases as release_ops,
)
from servefleet.recipes import base
from servefleet.recipes.service import AnyChanged, ServiceRun

HEALTH_SCRIPT = "files/health/health.py"
# The one reader of the engine's answers (deadline, byte and depth bounds, strict types): the
# health check and the bench (servefleet.verbs.bench) load it from bin/, beside themselves.
ENGINE_CLIENT = "files/engine_client/engine_client.py"
ENGINE_CLIENT_NAME = "engine_client.py"


def service_reads(lay: NodeLayout, unit: str) -> list:
    """The reads of a serving recipe's plan about its service: the release records, the running
    release, and what the drift check reads besides (servefleet.verbs.deep_drift: the unit's
    hash and state), so drift sends no more commands than a no-op converge."""
    reads = [
        (NodeReleases, {"path": lay.releases_file}),
        (RunningRelease, {"path": lay.running_file}),
        (Sha1File, {"path": lay.unit_path(unit)}),
        (UnitState, {"unit": unit}),
    ]
    if lay.metrics_textfile:  # the metrics step (servefleet.operations.metrics.textfile)
        path = lay.metrics_textfile
        reads += [
            (NodeChecks, {"path": lay.checks_file}),
            (PathStat, {"path": posixpath.dirname(path)}),
            (File, {"path": path}),
            (Sha256File, {"path": path}),
        ]
    return reads


def api_key(env_file: str | None = None, env_var: str | None = None) -> AnyChanged:
    """etc/api-key (root 0600; an engine that reads a file gets it through LoadCredential=), and, for an engine
    that reads its key from the environment, env_file holding `env_var=KEY` (root 0600, an
    EnvironmentFile=). Without api_key_file, neither exists."""
    data, lay = base.data(), base.layout()
    paths = [lay.api_key_file] + ([env_file] if env_file else [])
    if not data.get("api_key_file"):
        return AnyChanged([files.absent(name=f"No API key file {p}", path=p) for p in paths])
    key = read_secret(data["api_key_file"])
    ops: list[OperationMeta] = [
        files.upload(
            name=f"API key -> {lay.api_key_file} (0600)",
            dest=lay.api_key_file,
            content=key + "\n",
            mode="600",
            secret=True,
        )
    ]
    if env_file:
        ops.append(
            files.upload(
                name=f"API key -> {env_file} (0600)",
                dest=env_file,
                content=f"{env_var}={key}\n",
                mode="600",
                secret=True,
            )
        )
    return AnyChanged(ops)


def gate_args(unit: str, **engine) -> dict:
    """The health check's arguments for this host (also a rollout's gate); `engine`: what one
    engine adds (servefleet.operations.health.check's other parameters)."""
    data, lay = base.data(), base.layout()
    return {
        "script": lay.bin("servefleet-health"),
        "python": base.python(),
        "url": api_url(data),
        "model": data["served_model_name"],
        "unit": unit,
        "key_file": lay.api_key_file if data.get("api_key_file") else None,
        "timeout_s": data["health_timeout_s"],
        "settle_s": data["health_settle_s"],
        "expect_stopped": data["service_state"] != "running",
        **engine,
    }


def health(label: str, svc: ServiceRun, gate: dict, engine: Engine) -> None:
    """Only when the service was (re)started in this run: the gate, then the running release
    recorded (state/running.json: what a later run compares with what it installs)."""
    lay = base.layout()
    files.upload(
        name="Engine answer reader",
        dest=lay.bin(ENGINE_CLIENT_NAME),
        content=open(ENGINE_CLIENT, "rb").read(),
        mode="644",
    )
    files.upload(
        name="Health check script",
        dest=lay.bin("servefleet-health"),
        content=open(HEALTH_SCRIPT, "rb").read(),
        mode="755",
    )
    generic, own = health_ops.split_gate(gate)
    health_ops.check(
        name=label,
        **generic,
        engine_args=lambda on_node: engine.health_args(own, on_node),
        _if=svc.started,
    )
    release_ops.mark_running(
        name="The running release",
        running_file=lay.running_file,
        release=svc.release_of,
        _if=svc.started,
    )
    if lay.metrics_textfile:
        metrics_ops.textfile(
            name="servefleet metrics for node_exporter",
            path=lay.metrics_textfile,
            releases_file=lay.releases_file,
            checks_file=lay.checks_file,
            health_ran=svc.started,
        )
