"""pyinfra facts about the vLLM installed in a node's venv.

Each fact answers one question by looking at the venv's files, never by importing vLLM
(importing it takes seconds and pulls in torch). Hashes come from pyinfra's own
``pyinfra.facts.files.Sha256File``.

    host.get_fact(VllmVersion, venv="/opt/vllm/venv")      # "0.24.0" or None
    host.get_fact(VllmModelFile, venv="/opt/vllm/venv")    # ".../models/qwen3_5.py" or None
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

# Relative to a venv: where pip puts packages (venv/lib/python3.X/site-packages).
SITE_PACKAGES_GLOB = "lib/python3.*/site-packages"


def _only_one(output: list[str], what: str) -> str | None:
    """The single non-empty line of `output`, None for none; several is an error."""
    found = [line.strip() for line in output if line.strip()]
    if len(found) > 1:
        # e.g. two python3.* site-packages in one venv: refuse to guess which one runs.
        raise FactProcessError(f"more than one {what}: {', '.join(found)}")
    return found[0] if found else None


def _venv_glob(venv: str, pattern: str) -> StringCommand:
    """The quoted venv followed by an unquoted glob, so the shell expands only the glob."""
    return StringCommand(
        QuoteString(venv.rstrip("/")), f"/{SITE_PACKAGES_GLOB}/{pattern}", _separator=""
    )


class VllmVersion(FactBase):
    """
    The version of vLLM installed in ``venv``, read from ``vllm-*.dist-info/METADATA``,
    or ``None`` when there is none.
    """

    def command(self, venv: str) -> StringCommand:
        metadata = _venv_glob(venv, "vllm-*.dist-info/METADATA")
        # Headers only (up to the first blank line): the description may say "Version:".
        # The loop leaves an unmatched glob literal, hence `test -f`; `true` keeps a
        # venv without vLLM an answer (None), not a failed fact.
        loop = '; do test -f "$f" && sed -n "/^$/q; s/^Version: *//p" "$f"; done; true'
        return StringCommand("for f in", metadata, loop)

    def process(self, output: list[str]) -> str | None:
        return _only_one(output, "vllm-*.dist-info")


class VllmModelFile(FactBase):
    """
    The path of ``vllm/model_executor/models/<filename>`` (default ``qwen3_5.py``) in the
    site-packages of ``venv``, or ``None`` when vLLM has no such file there.
    """

    def command(self, venv: str, filename: str = "qwen3_5.py") -> StringCommand:
        path = _venv_glob(venv, f"vllm/model_executor/models/{filename}")
        return StringCommand("for f in", path, '; do test -f "$f" && echo "$f"; done; true')

    def process(self, output: list[str]) -> str | None:
        return _only_one(output, "vLLM model file")
