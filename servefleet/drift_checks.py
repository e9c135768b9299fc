"""The recipes' deep checks: what the drift check's operations alone do not show, read with facts.

Registered with `servefleet.drift.deep_check`; `drift.check()` imports this module. Each check
runs per host after the deploy is loaded and applies only when that deploy installs the
recipe's unit on the host (its `Unit <name>` operation is in the plan), so a recipe's checks
never run for another recipe, for deploys/base.py, or on a host of another role.

    BF16 vLLM (deploys/serve_bf16.py)      torch / vLLM versions and torch CUDA vs the pins,
                                           qwen3_5.py and its .orig vs the recorded hashes,
                                           unit file vs the rendered template (a diff),
                                           model verified at the pinned revision, service state
    llama.cpp (deploys/serve_q4_llamacpp)  current build, its commit and CMake flags vs data,
                                           unit diff, model, service state

Items compare an expected value (from data and the repo) with what is found on the host.
"""

from __future__ import annotations

import difflib
import hashlib
import json

from pyinfra.facts.files import FileContents, Sha1File, Sha256File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from servefleet import drift, llamacpp, models, vllm
from servefleet.drift import DRIFTED, IN_SYNC, Item
from servefleet.facts_vllm import DistVersions, TorchCuda, VllmModelFile
from servefleet.operations import llamacpp as llama_ops
from servefleet.operations import vllm_patch
from servefleet.paths import REPO_ROOT

UNIT_DIR = "/etc/systemd/system"
DIFF_MAX_LINES = 24


# --- pure helpers (unit-tested) ----------------------------------------------------------------

def item(name: str, ok: bool, expected, found) -> Item:
    """A deep item whose state is decided by `ok` (values may differ in form, e.g. labels)."""
    return Item("deep", name, IN_SYNC if ok else DRIFTED, str(expected), str(found))


def unit_diff(expected: str, found_lines: list[str] | None, path: str,
              max_lines: int = DIFF_MAX_LINES) -> str:
    """A short unified diff from the rendered unit (-) to the node's file (+), 1 line of context."""
    if found_lines is None:
        return f"{path} is missing"
    lines = list(difflib.unified_diff(expected.splitlines(), list(found_lines),
                                      fromfile="rendered", tofile=path, lineterm="", n=1))
    body = lines[2:]  # without the ---/+++ header
    if not body:
        return f"{path} differs only in whitespace at the end of the file"
    if len(body) > max_lines:
        body = body[:max_lines] + [f"... ({len(body) - max_lines} more diff lines)"]
    return "\n".join(body)


def sha1_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def known_hashes() -> dict[str, str]:
    """sha256 -> what it is, for every recorded vLLM patch (pristine and patched qwen3_5.py)."""
    known = {}
    for version in vllm_patch.recorded_versions():
        rec = vllm_patch.recorded_patch(version)
        known[rec.pristine_sha256] = f"vLLM {version}'s own file"
        known[rec.patched_sha256] = f"patched for vLLM {version}"
    return known


def describe_sha(sha: str | None, known: dict[str, str], missing: str = "absent") -> str:
    if sha is None:
        return missing
    return f"{sha} ({known.get(sha, 'unknown content')})"


def patch_items(pinned: str, patch_wanted: bool, path: str | None, sha: str | None,
                orig_sha: str | None, known: dict[str, str]) -> list[Item]:
    """qwen3_5.py and its .orig against the hashes recorded for the pinned vLLM version."""
    rec = vllm_patch.recorded_patch(pinned)
    name = vllm_patch.MODEL_FILE
    if rec is None:
        return [item(f"{name} (vLLM patch)", False,
                     f"a patch recorded for vLLM {pinned} in files/patches/vllm/",
                     f"none recorded (recorded: {', '.join(vllm_patch.recorded_versions())})")]
    if path is None:
        missing = f"no {name} in the venv (vLLM missing?)"
        want = rec.patched_sha256 if patch_wanted else rec.pristine_sha256
        return [item(f"{name} (vLLM patch)", False, describe_sha(want, known), missing)]
    if patch_wanted:
        return [
            item(f"{name} (vLLM patch)", sha == rec.patched_sha256,
                 describe_sha(rec.patched_sha256, known), describe_sha(sha, known)),
            item(f"{name}.orig (pristine backup)", orig_sha == rec.pristine_sha256,
                 describe_sha(rec.pristine_sha256, known), describe_sha(orig_sha, known)),
        ]
    return [
        item(f"{name} (vLLM's own, vllm_patch = False)", sha == rec.pristine_sha256,
             describe_sha(rec.pristine_sha256, known), describe_sha(sha, known)),
        item(f"{name}.orig (none when unpatched)", orig_sha is None, "absent",
             describe_sha(orig_sha, known)),
    ]


def version_items(venv: str, found: dict[str, str], pins: dict[str, str],
                  cuda: str | None, wanted_cuda: str) -> list[Item]:
    """Installed versions vs pins (a pin without a local label matches any: 2.11.0+cu130)."""
    items = [item(f"{name} version in {venv}",
                  name in found and vllm.public_version(found[name]) == pin,
                  pin, found.get(name, "not installed"))
             for name, pin in pins.items()]
    if "torch" in found:
        items.append(item("torch.version.cuda", cuda == wanted_cuda, wanted_cuda,
                          cuda or "None (a CPU build)"))
    return items


def model_item(repo: str, revision: str, include: list[str], dest: str, record: dict | None,
               resolved: str | None = None, why_invalid: str = "") -> Item:
    """The model in dest verified at the pinned revision.

    A 40-hex revision must be the recorded sha. A branch or tag is shown as the expected label
    (with the sha it resolves to now, when known) and the recorded sha as found.
    """
    name = f"model {repo} in {dest}"
    pinned = bool(models.SHA_RE.fullmatch(revision))
    expected = f"{repo}@{revision}" if pinned or not resolved else f"{repo}@{revision} = {resolved}"
    if not record:
        return item(name, False, expected, f"no verified copy ({why_invalid or 'no record'})")
    found = f"{record.get('repo_id')}@{record.get('revision')} = {record.get('sha')}"
    ok = record.get("repo_id") == repo \
        and sorted(record.get("include") or []) == sorted(include) \
        and (record.get("sha") == revision if pinned else
             record.get("revision") == revision and (resolved is None or record.get("sha") == resolved))
    if sorted(record.get("include") or []) != sorted(include):
        found += f" (include {record.get('include')}, data says {list(include)})"
    return item(name, ok, expected, found)


def invalid_record_reason(record: dict | None, on_disk: dict[str, int]) -> str:
    """Why VerifiedModel found no valid record: missing record, or files missing/resized."""
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return f"no {models.RECORD}"
    missing = sorted(p for p in record["files"] if p not in on_disk)
    resized = sorted(p for p, s in record["files"].items() if p in on_disk and on_disk[p] != s)
    parts = []
    if missing:
        parts.append("missing: " + ", ".join(missing))
    if resized:
        parts.append("size changed: " + ", ".join(resized))
    return "; ".join(parts) or "record unreadable"


def flags_text(flags: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(flags.items())) or "(none)"


def flags_delta(expected: dict, found: dict) -> tuple[str, str]:
    """Only the flags that differ, as (expected, found) texts; all of them when equal."""
    if expected == found:
        return flags_text(expected), flags_text(found)
    keys = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
    fmt = lambda d: " ".join(f"{k}={d[k]}" if k in d else f"{k} unset" for k in keys)  # noqa: E731
    return fmt(expected), fmt(found)


def build_items(data, builds: llama_ops.Builds) -> list[Item]:
    """The llama.cpp build `current` points at vs the pinned commit and the CMake flags of data."""
    want_name, commit = llamacpp.build_name(data), data["llamacpp_commit"]
    flags = dict(data["llamacpp_cmake_flags"])
    current = builds.current_name
    rec = builds.records.get(current) if current else None
    items = [item("llama.cpp current build", current == want_name, want_name,
                  current or "no `current` link")]
    if rec is None:
        why = "no build.json for current" if current else "no build"
        items += [item("llama.cpp commit", False, commit, why),
                  item("llama.cpp CMake flags", False, flags_text(flags), why)]
        return items
    items.append(item("llama.cpp commit", rec.get("commit") == commit, commit,
                      rec.get("commit") or "(not recorded)"))
    found_flags = rec.get("cmake_flags") or {}
    exp, got = flags_delta(flags, found_flags)
    items.append(item("llama.cpp CMake flags", found_flags == flags, exp, got))
    return items


def service_items(unit: str, state: str, enabled: bool, active: bool | None,
                  is_enabled: bool | None) -> list[Item]:
    """service_state / service_enabled of data vs systemd."""
    return [
        item(f"{unit} active", (state == "running") == bool(active), state,
             "running" if active else "stopped"),
        item(f"{unit} enabled", enabled == bool(is_enabled),
             "enabled" if enabled else "disabled", "enabled" if is_enabled else "disabled"),
    ]


def render(template, context: dict, extra: dict | None = None) -> str:
    """A unit template rendered as files.template renders it (pyinfra's jinja2 settings)."""
    from pyinfra.api.util import get_template

    return get_template(str(template)).render({**context, **(extra or {})})


# --- facts missing from the recipes ------------------------------------------------------------

class ModelRecordFiles(models.VerifiedModel):
    """VerifiedModel's raw read: (record or None, {path: size on disk}), to say why it is invalid."""

    def process(self, output):
        marker = models._SIZES
        if marker not in output:
            return None, {}
        cut = output.index(marker)
        try:
            record = json.loads("\n".join(output[:cut]))
        except ValueError:
            record = None
        on_disk = {}
        for line in output[cut + 1:]:
            size, _, path = line.partition(" ")
            if size.isdigit():
                on_disk[path] = int(size)
        return record, on_disk


# --- host-side reads (run in the host's context by drift.check) --------------------------------

def recipe_loaded(host, unit: str) -> bool:
    """Did the deploy just loaded plan the recipe's unit (`Unit <unit>`) on this host?"""
    state = host.state
    target = f"Unit {unit}"
    return any(name.rsplit(" | ", 1)[-1] == target
               for op_hash in state.ops.get(host, {})
               for name in state.op_meta[op_hash].names)


def _unit_item(host, unit: str, template, context: dict) -> Item:
    path = f"{UNIT_DIR}/{unit}"
    rendered = render(template, context, {"host": host, "state": host.state,
                                          "inventory": host.state.inventory})
    label = f"{template.relative_to(REPO_ROOT)} rendered for {host.name}"
    if host.get_fact(Sha1File, path=path) == sha1_text(rendered):
        return item(f"unit {path}", True, label, "same content")
    return item(f"unit {path}", False, label,
                unit_diff(rendered, host.get_fact(FileContents, path=path), path))


def _model_item(host, data, repo: str, revision: str, include: list[str], dest: str) -> Item:
    record = host.get_fact(models.VerifiedModel, path=dest)
    why = ""
    if record is None:
        why = invalid_record_reason(*host.get_fact(ModelRecordFiles, path=dest))
    resolved = None
    if not models.SHA_RE.fullmatch(revision) and data.get("model_source", "hub") == "hub":
        try:  # the same call as the fetch operation's: answered from its cache, no request
            resolved = models.hub_commit(data["hf_endpoint"], repo, revision,
                                         models.operator_token(data),
                                         data["hub_timeout_seconds"]).sha
        except models.HubError:
            resolved = None  # the fetch operation reports it
    return model_item(repo, revision, include, dest, record, resolved, why)


def _service_items(host, data, unit: str) -> list[Item]:
    active = host.get_fact(SystemdStatus, services=unit).get(unit)
    enabled = host.get_fact(SystemdEnabled, services=unit).get(unit)
    return service_items(unit, data["service_state"], data["service_enabled"], active, enabled)


@drift.deep_check
def vllm_recipe(host) -> list[Item]:
    """deploys/serve_bf16.py: versions, patch hashes, unit diff, model, service."""
    if not recipe_loaded(host, vllm.UNIT):
        return []
    data = host.data.dict()
    venv, pins = vllm.venv_path(data), vllm.pins(data)
    found = host.get_fact(DistVersions, venv=venv, names=tuple(pins))
    cuda = host.get_fact(TorchCuda, venv=venv) if "torch" in found else None
    items = version_items(venv, found, pins, cuda, data["torch_cuda"])

    path = host.get_fact(VllmModelFile, venv=venv, filename=vllm_patch.MODEL_FILE)
    sha = host.get_fact(Sha256File, path=path) if path else None
    orig = host.get_fact(Sha256File, path=f"{path}.orig") if path else None
    items += patch_items(data["vllm_version"], data["vllm_patch"], path, sha, orig,
                         known_hashes())

    model = vllm.model_dir(data)
    items.append(_unit_item(host, vllm.UNIT, vllm.UNIT_TEMPLATE,
                            vllm.unit_context(data, venv, model)))
    items.append(_model_item(host, data, data["model_repo"], data["model_revision"],
                             list(data["model_include"]), model))
    return items + _service_items(host, data, vllm.UNIT)


@drift.deep_check
def llamacpp_recipe(host) -> list[Item]:
    """deploys/serve_q4_llamacpp.py: build (commit, flags), unit diff, model, service."""
    if not recipe_loaded(host, llamacpp.UNIT):
        return []
    data = host.data.dict()
    items = build_items(data, host.get_fact(llama_ops.LlamaBuilds, root=data["servefleet_root"]))
    context = llamacpp.unit_context(data, override_kv=lambda: llamacpp.override_kv(data))
    items.append(_unit_item(host, llamacpp.UNIT, llamacpp.UNIT_TEMPLATE, context))
    items.append(_model_item(host, data, data["model_repo"], data["model_revision"],
                             [data["model_file"]], llamacpp.model_dir(data)))
    return items + _service_items(host, data, llamacpp.UNIT)
