"""The vLLM recipe's node-side preflight, between the model fetch and the service start:
checkpoint lint, memory preflight, page-cache eviction.

The lint and the preflight read the checkpoint on the node (config.json, the safetensors
index, the shard sizes) when they execute, so they see a model fetched earlier in the same
run. They change nothing: a problem fails this host only, naming what was found; a pass is a
no-op. Eviction runs a script from files/ on the node and is meant for `_if=`.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from pyinfra import host
from pyinfra.api import operation

from servefleet.core.lint.checkpoint import (
    INDEX_FILE,
    MAX_INDEX_BYTES,
    MISSING_SHARDS,
    check_recipe,
    lint_checkpoint,
)
from servefleet.core.lint.safe_files import MAX_CONFIG_BYTES, CheckpointError, parse_json_object
from servefleet.core.node import usable_memory
from servefleet.engines.vllm.facts import SafetensorsBytes
from servefleet.engines.vllm.logic import memory_verdict
from servefleet.facts import batch
from servefleet.facts.models import ModelFile, file_problem
from servefleet.facts.node import MemoryBytes, NvidiaGpus
from servefleet.operations.node import fail_host


def _executing() -> bool:
    return bool(host.state and host.state.is_executing)


def model_file_reads(path: str, user: str) -> list:
    """The reads of the checkpoint's JSON files (servefleet.facts.batch plans them)."""
    return [(ModelFile, _file_args(f"{path}/{name}", user)) for name in ("config.json", INDEX_FILE)]


def _file_args(path: str, user: str) -> dict:
    bound = MAX_INDEX_BYTES if path.endswith(INDEX_FILE) else MAX_CONFIG_BYTES
    return {"path": path, "user": user, "max_bytes": bound}


def file_on_node(path: str, user: str):
    """A checkpoint file's text, read as user, the service user (the engine can write the
    models root: no symlink followed, regular files only, bounded); None when absent.
    ValueError (one line) when it cannot be read."""
    args = _file_args(path, user)
    problem, text = file_problem(batch.get(host, ModelFile, **args), args["max_bytes"])
    if problem:
        raise ValueError(f"{path}: {problem}")
    return text


def read_json_on_node(path: str, user: str):
    """A JSON object file on the node: its value, None when missing; raises ValueError (one
    line) when it is not strict JSON (no NaN, duplicate keys or deep nesting) or unreadable."""
    text = file_on_node(path, user)
    if text is None:
        return None
    try:
        return parse_json_object(text.encode(), path)
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None


def _not_yet(path: str, what: str) -> bool:
    """Before execution a file the run has yet to fetch is no problem: check it when it runs."""
    if _executing():
        return False
    host.noop(f"{what}: {path} is not on the node yet; checked once this run has fetched it")
    return True


def lint_on_node(path: str, user: str):
    """CheckpointLint of the checkpoint at `path` on this host, from its two JSON files.

    Returns (lint, None) or (None, problem). The lint itself is servefleet.lint.checkpoint's,
    run locally on copies of config.json and the index (the shards stay on the node).
    """
    try:
        config = read_json_on_node(f"{path}/config.json", user)
        index = read_json_on_node(f"{path}/{INDEX_FILE}", user)
    except ValueError as exc:
        return None, f"{path}: config.json or {INDEX_FILE} is not valid JSON ({exc})"
    if config is None:
        return None, f"no {path}/config.json on {host.name}"
    if index is None:
        return None, (
            f"no {path}/{INDEX_FILE} on {host.name}: the lint needs the safetensors "
            f"index (include it in model_include)"
        )
    with tempfile.TemporaryDirectory(prefix="servefleet-lint-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        (Path(tmp) / INDEX_FILE).write_text(json.dumps(index))
        lint = lint_checkpoint(tmp)
    # The shards are on the node, not in the local copy: that finding is about the copy.
    lint.findings = [f for f in lint.findings if f.code != MISSING_SHARDS]
    return lint, None


@operation()
def checkpoint_lint(path: str, language_model_only: bool, user: str):
    """
    Fail this host if the recipe would not load the checkpoint at ``path`` on the node.

    + path: the checkpoint directory on the node (config.json, model.safetensors.index.json)
    + language_model_only: whether the recipe serves with vLLM ``--language-model-only``
    + user: the service user, who owns the models root: the files are read as this user

    The tensor names come from the safetensors index, not from config.json: e.g. an
    architecture that builds a vision tower (``*ForConditionalGeneration`` with a
    ``vision_config``) with no ``visual.*`` tensors loads only language-model-only.

    **Example:**

    .. code:: python

        vllm_preflight.checkpoint_lint(path="/opt/servefleet/models/Qwen/Qwen-AgentWorld-35B-A3B",
                                       language_model_only=True, user="servefleet")
    """
    try:
        absent = file_on_node(f"{path}/config.json", user) is None
    except ValueError:
        absent = False  # lint_on_node names the problem
    if absent and _not_yet(path, "lint"):
        return
    lint, problem = lint_on_node(path, user)
    if problem:
        yield fail_host(problem)
        return
    errors = check_recipe(lint, language_model_only)
    facts_line = (
        f"{lint.architecture}, {lint.tensors} tensors, {lint.visual_tensors} visual, "
        f"{lint.mtp_tensors} mtp"
    )
    if errors:
        yield fail_host(
            f"checkpoint {path} on {host.name} ({facts_line}): "
            + "; ".join(errors)
            + f" (language_model_only = {language_model_only})"
        )
        return
    notes = "; ".join(f.message for f in lint.findings)
    host.noop(
        f"checkpoint {path}: {facts_line}; loads with language_model_only = "
        f"{language_model_only}" + (f" ({notes})" if notes else "")
    )


@operation()
def memory_preflight(path: str, data: dict, user: str):
    """
    Fail this host, with the numbers, when vLLM would refuse its KV pool or the memory budget
    (weights + pool + overhead) exceeds what the host may use.

    + path: the checkpoint directory on the node (config.json, *.safetensors)
    + data: recipe data: max_model_len, kv_cache_memory_bytes (None: vLLM auto-sizes),
      kv_block_alignment, memory_overhead_bytes, usable_memory_bytes (None: from the host)
    + user: the service user, who owns the models root: the files are read as this user

    The arithmetic is servefleet.kvplan's (vLLM 0.24.0's own); usable memory is
    servefleet.preflight.usable_memory (data, else the GPU's memory, else system memory).

    **Example:**

    .. code:: python

        vllm_preflight.memory_preflight(path="/opt/servefleet/models/Qwen/Qwen-AgentWorld-35B-A3B",
                                        data=host.data.dict(), user="servefleet")
    """
    try:
        config = read_json_on_node(f"{path}/config.json", user)
    except ValueError as exc:
        yield fail_host(f"cannot use {path}/config.json on {host.name}: {exc}")
        return
    if config is None:
        if _not_yet(path, "memory preflight"):
            return
        yield fail_host(f"no {path}/config.json on {host.name}: nothing to plan the KV cache with")
        return
    weights = batch.get(host, SafetensorsBytes, path=path, user=user)
    usable = usable_memory(data, batch.get(host, MemoryBytes), batch.get(host, NvidiaGpus))
    try:
        verdict = memory_verdict(config, weights, usable, data)
    except ValueError as exc:
        yield fail_host(f"plan-kv cannot read {path}/config.json on {host.name}: {exc}")
        return
    if verdict.problems:
        yield fail_host(
            f"memory preflight failed on {host.name}: "
            + "; ".join(verdict.problems)
            + f" [{verdict.summary()}]"
        )
        return
    host.noop(f"memory preflight on {host.name}: {verdict.summary()}")


@operation()
def evict_page_cache(
    path: str,
    script: str,
    user: str,
    python: str = "python3",
    record: str | None = None,
    drop_caches: bool = False,
):
    """
    Evict the files under ``path`` from the page cache, file by file
    (``posix_fadvise(POSIX_FADV_DONTNEED)``), and report the bytes evicted.

    + path: directory tree to evict (regular files; no symlink followed)
    + script: files/pagecache/evict.py, already on the node
    + user: the tree's owner (the service user): the walk runs as this user, never as root,
      since the engine can write the tree
    + python: interpreter that runs it
    + record: JSON file on the node that keeps the last report
    + drop_caches: also ``echo 1 > /proc/sys/vm/drop_caches`` (every clean page of the host;
      fails where /proc/sys is read-only, e.g. in a container)

    Always runs when called: guard it with ``_if=``.

    **Example:**

    .. code:: python

        vllm_preflight.evict_page_cache(path="/opt/servefleet/models/Qwen/Qwen-AgentWorld-35B-A3B",
                                        script="/opt/servefleet/bin/servefleet-evict-page-cache",
                                        user="servefleet", _if=model.changed)
    """
    argv = [python, "-I", script, path, "--user", user]
    if record:
        argv += ["--record", record]
    if drop_caches:
        argv.append("--drop-caches")
    yield " ".join(shlex.quote(a) for a in argv)
