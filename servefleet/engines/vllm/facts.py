"""Facts about the vLLM installed in a node's venv, and the checkpoint it serves.

Each fact answers one question by looking at the venv's files, never by importing vLLM
(importing it takes seconds and pulls in torch). Hashes come from pyinfra's own
``pyinfra.facts.files.Sha256File``.

    host.get_fact(VllmVersion, venv="/opt/vllm/venv")      # "0.24.0" or None
    host.get_fact(VllmModelFile, venv="/opt/vllm/venv")    # ".../models/qwen3_5.py" or None
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase, QuoteString, StringCommand

from servefleet.facts.pyenv import only_one, venv_glob


class VllmVersion(FactBase[str | None]):
    """
    The version of vLLM installed in ``venv``, read from ``vllm-*.dist-info/METADATA``,
    or ``None`` when there is none.
    """

    def command(self, venv: str) -> StringCommand:
        metadata = venv_glob(venv, "vllm-*.dist-info/METADATA")
        # Headers only (up to the first blank line): the description may say "Version:".
        # The loop leaves an unmatched glob literal, hence `test -f`; `true` keeps a
        # venv without vLLM an answer (None), not a failed fact.
        loop = '; do test -f "$f" && sed -n "/^$/q; s/^Version: *//p" "$f"; done; true'
        return StringCommand("for f in", metadata, loop)

    def process(self, output: list[str]) -> str | None:
        return only_one(output, "vllm-*.dist-info")


class VllmModelFile(FactBase[str | None]):
    """
    The path of ``vllm/model_executor/models/<filename>`` (default ``qwen3_5.py``) in the
    site-packages of ``venv``, or ``None`` when vLLM has no such file there.
    """

    def command(self, venv: str, filename: str = "qwen3_5.py") -> StringCommand:
        path = venv_glob(venv, f"vllm/model_executor/models/{filename}")
        return StringCommand("for f in", path, '; do test -f "$f" && echo "$f"; done; true')

    def process(self, output: list[str]) -> str | None:
        return only_one(output, "vLLM model file")


class SafetensorsBytes(FactBase[int]):
    """Sum of the sizes of the regular ``*.safetensors`` files in ``path``, 0 for none. Listed
    as ``user`` (the directory's owner: the engine can write it) and no symlink followed."""

    default = int  # no output: 0

    def command(self, path: str, user: str) -> StringCommand:
        u = shlex.quote(user)
        return StringCommand(
            f"if id -u {u} >/dev/null 2>&1; then runuser -u {u} -- find",
            QuoteString(path),
            "-maxdepth 1 -name '*.safetensors' -type f -printf '%s\\n' 2>/dev/null; fi; true",
        )

    def process(self, output: list[str]) -> int:
        return sum(int(line) for line in output if line.strip().isdigit())
