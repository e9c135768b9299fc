"""
Patch vLLM's ``qwen3_5.py`` in a node's venv so ``--language-model-only`` builds no
vision tower (``self.visual = None``) and loading skips ``visual.*`` weights.

Stock vLLM 0.24.0 / 0.26.0 build the 27-block vision tower of
``Qwen3_5MoeForConditionalGeneration`` even for text-only checkpoints such as
Qwen/Qwen-AgentWorld-35B-A3B, which ship no ``visual.*`` tensors. The patches, with the
sha256 of the pristine and patched file per vLLM version, live in
``files/patches/vllm/<version>/`` of the servefleet repository.

Run on its own::

    pyinfra @local servefleet.engines.vllm.operations.patch.apply venv=/opt/vllm/venv \
        workdir=/opt/servefleet/bin -y
    pyinfra inventory.py servefleet.engines.vllm.operations.patch.revert venv=/opt/vllm/venv -y
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from servefleet.engines.vllm.facts import VllmModelFile, VllmVersion
from servefleet.facts import batch
from servefleet.facts.files import RegularFileSha256
from servefleet.facts.pyenv import Several
from servefleet.operations.files import upload
from servefleet.operations.node import fail_host

# The operator's project (pyinfra resolves files/ against the current directory).
PATCH_ROOT = Path("files") / "patches" / "vllm"
# Runs on the node with the venv's python: nodes need neither `patch` nor servefleet.
NODE_APPLIER = PATCH_ROOT / "apply_patch.py"
MODEL_FILE = "qwen3_5.py"


@dataclass(frozen=True)
class RecordedPatch:
    """What files/patches/vllm/<version>/ records for one vLLM version."""

    version: str
    patch_file: Path
    pristine_sha256: str
    patched_sha256: str


def recorded_versions() -> list[str]:
    """vLLM versions that have a recorded patch."""
    return sorted(p.parent.name for p in PATCH_ROOT.glob("*/hashes.json"))


def recorded_patch(version: str) -> RecordedPatch | None:
    """The recorded patch for `version`, or None when there is none."""
    hashes = PATCH_ROOT / version / "hashes.json"
    if not hashes.is_file():
        return None
    data = json.loads(hashes.read_text())
    return RecordedPatch(
        version=version,
        patch_file=PATCH_ROOT / version / data["patch"],
        pristine_sha256=data["pristine_sha256"],
        patched_sha256=data["patched_sha256"],
    )


@dataclass(frozen=True)
class _NodeState:
    """The facts both operations decide on."""

    venv: str
    version: str
    path: str
    sha256: str | None
    orig_sha256: str | None
    patch: RecordedPatch

    @property
    def orig(self) -> str:
        return f"{self.path}.orig"

    def refuse(self, problem: str, fix: str) -> StringCommand:
        """Fail this host only, saying what was found, that nothing changed, and what to do."""
        return _refuse(
            f"vLLM {self.version} in {self.venv}: {problem}; {self.path} left untouched. {fix}"
        )


def _refuse(message: str) -> StringCommand:
    """The command that fails this host with `message` (other hosts go on)."""
    return fail_host(f"{host.name}: {message}")


def _node_state(venv: str) -> _NodeState | StringCommand:
    """Read the facts; when vLLM, its file or its recorded patch is missing, the command that
    stops this host instead (yield it)."""
    version = batch.get(host, VllmVersion, venv=venv)
    if isinstance(version, Several):
        return _refuse(f"{venv}: {version}; check the venv")
    if version is None:
        return _refuse(
            f"no vLLM in {venv} (no lib/python3.*/site-packages/vllm-*.dist-info/METADATA); "
            "check the venv path"
        )
    path = batch.get(host, VllmModelFile, venv=venv, filename=MODEL_FILE)
    if isinstance(path, Several):
        return _refuse(f"vLLM {version} in {venv}: {path}")
    if path is None:
        return _refuse(f"vLLM {version} in {venv} has no model file {MODEL_FILE} (a regular file)")
    # Both digests in one read (the path is known only now). Each must be a regular file, read
    # without following a symlink; a FIFO or a directory is only stat'ed (it would hang a read).
    orig = f"{path}.orig"
    batch.plan(host, [(RegularFileSha256, {"path": path}), (RegularFileSha256, {"path": orig})])
    found = {p: batch.get(host, RegularFileSha256, path=p) for p in (path, orig)}
    digests: dict[str, str | None] = {}  # of the regular files; None for an absent .orig
    for p, kind in found.items():
        if kind is None or kind[0] not in ("file", "absent") or (p == path and kind[0] != "file"):
            what = (
                "cannot be read"
                if kind is None
                else "is gone"
                if kind[0] == "absent"
                else f"is a {kind[0]}"
            )
            fix = "Move it away" if p == orig else f"Reinstall vllm=={version} in that venv"
            return _refuse(
                f"vLLM {version} in {venv}: {p} {what}, not a regular file; nothing "
                f"was changed (the patch never follows a link nor opens anything "
                f"else). {fix}"
            )
        digests[p] = kind[1]
    sha256 = digests[path]

    patch = recorded_patch(version)
    if patch is None:
        return _refuse(
            f"vLLM {version} in {venv}: no patch recorded for this version "
            f"(recorded: {', '.join(recorded_versions()) or 'none'}); {path} "
            f"(sha256 {sha256}) left untouched. Install a recorded version, or record "
            f"a patch and its hashes in {PATCH_ROOT / version}/."
        )
    return _NodeState(
        venv=venv,
        version=version,
        path=path,
        sha256=sha256,
        orig_sha256=digests[orig],
        patch=patch,
    )


def _reinstall_hint(state: _NodeState) -> str:
    return (
        f"Restore the shipped file (pip install --force-reinstall --no-deps "
        f"vllm=={state.version} in that venv) and run again."
    )


@operation()
def apply(venv: str, workdir: str):
    """
    Patch ``qwen3_5.py`` of the vLLM in ``venv`` with the patch recorded for its version.

    + venv: path of the node's virtualenv holding vLLM
    + workdir: a root-owned directory for the applier and the patch (servefleet's bin/)

    The file must be the pristine one of that version (by sha256); a copy is kept as
    ``qwen3_5.py.orig`` (written once, never overwritten) and the result must match the
    recorded patched sha256. Anything unexpected (no vLLM, a version without a recorded
    patch, a modified file or backup) fails this host only, with what was found and what to
    do, and changes nothing; other hosts go on.

    **Example:**

    .. code:: python

        from servefleet.engines.vllm.operations import patch as vllm_patch
        vllm_patch.apply(
            name="Build no vision tower with --language-model-only",
            venv="/opt/vllm/venv", workdir="/opt/servefleet/bin",
        )
    """
    state = _node_state(venv)
    if not isinstance(state, _NodeState):
        yield state
        return
    patch = state.patch

    if state.orig_sha256 not in (None, patch.pristine_sha256):
        yield state.refuse(
            f"the backup {state.orig} has sha256 {state.orig_sha256}, not the pristine "
            f"{patch.pristine_sha256}",
            f"Move it away (it is not vLLM's file). {_reinstall_hint(state)}",
        )
        return

    if state.sha256 == patch.patched_sha256:
        if state.orig_sha256 is None:
            yield state.refuse(
                f"the file is patched but its backup {state.orig} is missing",
                _reinstall_hint(state),
            )
            return
        host.noop(f"{state.path} is already patched for vLLM {state.version}")
        return

    if state.sha256 != patch.pristine_sha256:
        yield state.refuse(
            f"the file has sha256 {state.sha256}, which is neither the pristine "
            f"({patch.pristine_sha256}) nor the patched ({patch.patched_sha256}) one",
            _reinstall_hint(state),
        )
        return

    # The applier and the patch go to a root-owned directory (root runs the one and trusts the
    # other); the applier re-checks every hash before it writes.
    applier = f"{workdir.rstrip('/')}/servefleet-apply-patch.py"
    remote_patch = f"{workdir.rstrip('/')}/vllm-{state.version}-{MODEL_FILE}.patch"
    yield from upload._inner(dest=applier, content=NODE_APPLIER.read_bytes(), mode="755")
    yield from upload._inner(dest=remote_patch, content=patch.patch_file.read_bytes(), mode="644")
    yield StringCommand(
        QuoteString(f"{venv.rstrip('/')}/bin/python"),
        "-I",
        QuoteString(applier),
        QuoteString(state.path),
        QuoteString(remote_patch),
        patch.pristine_sha256,
        patch.patched_sha256,
    )


@operation()
def revert(venv: str):
    """
    Put back the pristine ``qwen3_5.py`` of the vLLM in ``venv`` from ``qwen3_5.py.orig``.

    + venv: path of the node's virtualenv holding vLLM

    The backup must have the pristine sha256 recorded for that vLLM version; it is moved
    over the file, so a reverted venv is byte-for-byte what pip installed.

    **Example:**

    .. code:: python

        from servefleet.engines.vllm.operations import patch as vllm_patch
        vllm_patch.revert(
            name="Restore vLLM's own qwen3_5.py",
            venv="/opt/vllm/venv",
        )
    """
    state = _node_state(venv)
    if not isinstance(state, _NodeState):
        yield state
        return
    pristine = state.patch.pristine_sha256

    if state.orig_sha256 is None:
        if state.sha256 == pristine:
            host.noop(f"{state.path} is vLLM {state.version}'s own file")
            return
        yield state.refuse(
            f"no backup {state.orig} to restore, and the file has sha256 {state.sha256}",
            _reinstall_hint(state),
        )
        return

    if state.orig_sha256 != pristine:
        yield state.refuse(
            f"the backup {state.orig} has sha256 {state.orig_sha256}, not the pristine {pristine}",
            _reinstall_hint(state),
        )
        return

    # mv keeps the backup's mode and mtime: those of the file pip installed.
    yield StringCommand("mv", "-f", QuoteString(state.orig), QuoteString(state.path))
