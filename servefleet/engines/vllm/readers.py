"""What the verbs read of a vLLM node with facts: status's engine line and drift's deep items
of the engine itself (versions and torch's CUDA vs the pins, qwen3_5.py and its .orig vs the
hashes recorded for the pinned version). The generic items (unit diff, model, service, release)
are servefleet.verbs.deep_drift's."""

from __future__ import annotations

from servefleet.core import drift_items as di
from servefleet.engines.vllm import logic
from servefleet.engines.vllm.facts import VllmModelFile
from servefleet.engines.vllm.operations import patch as vllm_patch
from servefleet.facts import batch
from servefleet.facts.files import RegularFileSha256
from servefleet.facts.pyenv import DistVersions, TorchCuda


def status(host, data) -> tuple[str, str]:
    """(short, detail) of the vLLM installed in the venv the data pins."""
    found = host.get_fact(DistVersions, venv=logic.venv_path(data), names=("torch", "vllm"))
    if "vllm" not in found:
        return "vllm: none", "vLLM: not installed"
    return f"vllm {found['vllm']}", f"vLLM {found['vllm']} (torch {found.get('torch', '?')})"


def unit_context(host, data, model_dir: str) -> dict:
    return logic.unit_context(data, model_dir)


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


def _regular_sha(host, path: str) -> str | None:
    kind = batch.get(host, RegularFileSha256, path=path)
    return kind[1] if kind and kind[0] == "file" else None


def deep_items(host, data, model_dir: str) -> list[di.Item]:
    """Versions vs pins, patch hashes: read with the facts the steps read (one batched read)."""
    venv = logic.venv_path(data)
    found = batch.get(host, DistVersions, venv=venv, names=tuple(logic.pins(data)))
    cuda = batch.get(host, TorchCuda, venv=venv) if "torch" in found else None
    items = logic.version_items(data, found, cuda)
    path = batch.get(host, VllmModelFile, venv=venv, filename=vllm_patch.MODEL_FILE)
    # The fact the patch step reads (no symlink followed, a FIFO only stat'ed): the same
    # batched read, and a planted FIFO cannot hang a drift check.
    sha, orig = (_regular_sha(host, p) for p in (path, f"{path}.orig")) if path else (None, None)
    return items + patch_items(
        data["vllm_version"], data["vllm_patch"], path, sha, orig, known_hashes()
    )
