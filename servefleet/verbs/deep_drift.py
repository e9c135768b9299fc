"""Drift's deep items, the recipes' deep checks: what drift's operations alone do not show, read
with facts.

Each check runs per host after the deploy is loaded and applies only when that deploy installs
the recipe's unit on the host (its `Unit <name>` operation is in the plan), so a recipe's checks
never run for another recipe, for deploys/base.py, or on a host of another role.

    BF16 vLLM (deploys/serve_bf16.py)      torch / vLLM versions and torch CUDA vs the pins,
                                           qwen3_5.py and its .orig vs the recorded hashes,
                                           unit file vs the rendered template (a diff),
                                           model verified at the pinned revision, service, release
    llama.cpp (deploys/serve_q4_llamacpp)  current build, its commit and CMake flags vs data,
                                           unit diff, model, service, release
"""

from __future__ import annotations

from pyinfra.facts.files import FileContents, Sha1File

from servefleet.core import drift_items as di, llamacpp as llama_logic, vllm as vllm_logic
from servefleet.core.layout import NodeLayout
from servefleet.core.models import (
    SHA_RE,
    HubError,
    hub_commit,
    invalid_record_reason,
    operator_token,
)
from servefleet.core.systemd import render_unit
from servefleet.facts import batch
from servefleet.facts.files import RegularFileSha256
from servefleet.facts.llamacpp import LlamaBuilds
from servefleet.facts.models import ModelRecordFiles, VerifiedModel, record_args
from servefleet.facts.releases import NodeReleases, RunningRelease
from servefleet.facts.systemd import UnitState
from servefleet.facts.vllm import DistVersions, TorchCuda, VllmModelFile
from servefleet.operations import vllm_patch
from servefleet.recipes import llamacpp as llama_recipe, vllm as vllm_recipe
from servefleet.recipes.models import model_dir


def known_hashes() -> dict[str, str]:
    """sha256 -> what it is, for every recorded vLLM patch (pristine and patched qwen3_5.py)."""
    known = {}
    for version in vllm_patch.recorded_versions():
        rec = vllm_patch.recorded_patch(version)
        if rec is None:  # recorded_versions() names the versions that have a hashes.json
            raise FileNotFoundError(f"the recorded patch of vLLM {version}: hashes.json is gone")
        known[rec.pristine_sha256] = f"vLLM {version}'s own file"
        known[rec.patched_sha256] = f"patched for vLLM {version}"
    return known


def patch_items(
    pinned: str,
    patch_wanted: bool,
    path: str | None,
    sha: str | None,
    orig_sha: str | None,
    known: dict[str, str],
) -> list[di.Item]:
    """qwen3_5.py and its .orig against the hashes recorded for the pinned vLLM version."""
    rec = vllm_patch.recorded_patch(pinned)
    name, item, describe = vllm_patch.MODEL_FILE, di.item, di.describe_sha
    if rec is None:
        return [
            item(
                f"{name} (vLLM patch)",
                False,
                f"a patch recorded for vLLM {pinned} in files/patches/vllm/",
                f"none recorded (recorded: {', '.join(vllm_patch.recorded_versions())})",
            )
        ]
    if path is None:
        want = rec.patched_sha256 if patch_wanted else rec.pristine_sha256
        return [
            item(
                f"{name} (vLLM patch)",
                False,
                describe(want, known),
                f"no {name} in the venv (vLLM missing?)",
            )
        ]
    if patch_wanted:
        return [
            item(
                f"{name} (vLLM patch)",
                sha == rec.patched_sha256,
                describe(rec.patched_sha256, known),
                describe(sha, known),
            ),
            item(
                f"{name}.orig (pristine backup)",
                orig_sha == rec.pristine_sha256,
                describe(rec.pristine_sha256, known),
                describe(orig_sha, known),
            ),
        ]
    return [
        item(
            f"{name} (vLLM's own, vllm_patch = False)",
            sha == rec.pristine_sha256,
            describe(rec.pristine_sha256, known),
            describe(sha, known),
        ),
        item(
            f"{name}.orig (none when unpatched)",
            orig_sha is None,
            "absent",
            describe(orig_sha, known),
        ),
    ]


def recipe_loaded(host, unit: str) -> bool:
    """Did the deploy just loaded plan the recipe's unit (`Unit <unit>`) on this host?"""
    state = host.state
    target = f"Unit {unit}"
    return any(
        name.rsplit(" | ", 1)[-1] == target
        for op_hash in state.ops.get(host, {})
        for name in state.op_meta[op_hash].names
    )


def unit_item(host, unit: str, template: str, context: dict) -> di.Item:
    path = NodeLayout.unit_path(unit)
    rendered = render_unit(template, context)
    label = f"{template} rendered for {host.name}"
    if batch.get(host, Sha1File, path=path) == di.sha1_text(rendered):
        return di.item(f"unit {path}", True, label, "same content")
    return di.item(
        f"unit {path}",
        False,
        label,
        di.unit_diff(rendered, batch.get(host, FileContents, path=path), path),
    )


def model_item(host, data, include: list[str], dest: str) -> di.Item:
    repo, revision = data["model_repo"], data["model_revision"]
    args = record_args(data, dest)
    record = batch.get(host, VerifiedModel, **args)
    why = "" if record else invalid_record_reason(*batch.get(host, ModelRecordFiles, **args))
    resolved = None
    if not SHA_RE.fullmatch(revision) and data.get("model_source", "hub") == "hub":
        try:  # the same call as the fetch operation's: answered from its cache, no request
            resolved = hub_commit(
                data["hf_endpoint"],
                repo,
                revision,
                operator_token(data, host.name),
                data["hub_timeout_seconds"],
            ).sha
        except HubError:
            resolved = None  # the fetch operation reports it
    return di.model_item(repo, revision, include, dest, record, resolved, why)


def service_and_release(host, data, unit: str) -> list[di.Item]:
    st = batch.get(host, UnitState, unit=unit)
    items = di.service_items(
        unit, data["service_state"], data["service_enabled"], st["active"], st["enabled"]
    )
    lay = NodeLayout.of(data)
    records = batch.get(host, NodeReleases, path=lay.releases_file)
    running = batch.get(host, RunningRelease, path=lay.running_file)
    return items + di.release_items(records, running, data["service_state"] == "running")


def _regular_sha(host, path: str) -> str | None:
    kind = batch.get(host, RegularFileSha256, path=path)
    return kind[1] if kind and kind[0] == "file" else None


def vllm_items(host) -> list[di.Item]:
    """deploys/serve_bf16.py: versions, patch hashes, unit diff, model, service, release."""
    if not recipe_loaded(host, vllm_logic.UNIT):
        return []
    data = host.data.dict()
    venv, pins = vllm_logic.venv_path(data), vllm_logic.pins(data)
    found = batch.get(host, DistVersions, venv=venv, names=tuple(pins))
    cuda = batch.get(host, TorchCuda, venv=venv) if "torch" in found else None
    items = di.version_items(venv, found, pins, cuda, data["torch_cuda"])
    path = batch.get(host, VllmModelFile, venv=venv, filename=vllm_patch.MODEL_FILE)
    # The fact the patch step reads (no symlink followed, a FIFO only stat'ed): the same
    # batched read, and a planted FIFO cannot hang a drift check.
    sha, orig = (_regular_sha(host, p) for p in (path, f"{path}.orig")) if path else (None, None)
    items += patch_items(data["vllm_version"], data["vllm_patch"], path, sha, orig, known_hashes())
    model = model_dir(data["model_repo"], data["model_revision"])
    items.append(
        unit_item(
            host, vllm_logic.UNIT, vllm_recipe.UNIT_TEMPLATE, vllm_logic.unit_context(data, model)
        )
    )
    items.append(model_item(host, data, list(data["model_include"]), model))
    return items + service_and_release(host, data, vllm_logic.UNIT)


def llamacpp_items(host) -> list[di.Item]:
    """deploys/serve_q4_llamacpp.py: build (commit, flags), unit diff, model, service, release."""
    if not recipe_loaded(host, llama_logic.UNIT):
        return []
    data = host.data.dict()
    lay = NodeLayout.of(data)
    items = di.build_items(data, batch.get(host, LlamaBuilds, llama_dir=lay.llama_dir))
    model = model_dir(data["model_repo"], data["model_revision"])
    context = llama_logic.unit_context(data, model, llama_recipe.override_kv(model))
    items.append(unit_item(host, llama_logic.UNIT, llama_recipe.UNIT_TEMPLATE, context))
    items.append(model_item(host, data, [data["model_file"]], model))
    return items + service_and_release(host, data, llama_logic.UNIT)


DEEP_CHECKS = (vllm_items, llamacpp_items)
