"""Facts about the vLLM installed in a node's venv.

Each fact answers one question by looking at the venv's files, never by importing vLLM
(importing it takes seconds and pulls in torch). Hashes come from pyinfra's own
``pyinfra.facts.files.Sha256File``.

    host.get_fact(VllmVersion, venv="/opt/vllm/venv")      # "0.24.0" or None
    host.get_fact(VllmModelFile, venv="/opt/vllm/venv")    # ".../models/qwen3_5.py" or None
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

# Relative to a venv: where pip puts packages (venv/lib/python3.X/site-packages).
SITE_PACKAGES_GLOB = "lib/python3.*/site-packages"


class Several(str):
    """A fact's answer when the venv holds more than one (e.g. two python3.* site-packages):
    the operations refuse to guess which one runs, and say so (a FactProcessError would end
    the whole run where the host is the last one left)."""


def _only_one(output: list[str], what: str) -> str | None:
    """The single non-empty line of `output`, None for none, Several(...) for more."""
    found = [line.strip() for line in output if line.strip()]
    if len(found) > 1:
        return Several(f"more than one {what}: {', '.join(found)}")
    return found[0] if found else None


def _venv_glob(venv: str, pattern: str) -> StringCommand:
    """The quoted venv followed by an unquoted glob, so the shell expands only the glob."""
    return StringCommand(
        QuoteString(venv.rstrip("/")), f"/{SITE_PACKAGES_GLOB}/{pattern}", _separator=""
    )


class VllmVersion(FactBase[str | None]):
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


class VllmModelFile(FactBase[str | None]):
    """
    The path of ``vllm/model_executor/models/<filename>`` (default ``qwen3_5.py``) in the
    site-packages of ``venv``, or ``None`` when vLLM has no such file there.
    """

    def command(self, venv: str, filename: str = "qwen3_5.py") -> StringCommand:
        path = _venv_glob(venv, f"vllm/model_executor/models/{filename}")
        return StringCommand("for f in", path, '; do test -f "$f" && echo "$f"; done; true')

    def process(self, output: list[str]) -> str | None:
        return _only_one(output, "vLLM model file")


class DistVersions(FactBase[dict[str, str]]):
    """
    ``{distribution: version}`` of the given distributions installed in ``venv``, read from
    their ``*.dist-info/METADATA`` headers (no import); a missing one is absent from the dict.

        host.get_fact(DistVersions, venv="/opt/servefleet/venvs/vllm-0.24.0",
                      names=("torch", "vllm"))   # {"torch": "2.11.0", "vllm": "0.24.0"}
    """

    default = dict  # no output: nothing installed

    def command(self, venv: str, names: tuple[str, ...] = ("torch", "vllm")) -> StringCommand:
        # dist-info directories use the normalised name with "_" (e.g. flash_attn-2.8.dist-info).
        globs = [_venv_glob(venv, f"{n.replace('-', '_')}-*.dist-info/METADATA") for n in names]
        loop = (
            '; do test -f "$f" && sed -n "/^$/q; s/^Name: */name=/p; s/^Version: */version=/p"'
            ' "$f"; done; true'
        )
        return StringCommand("for f in", *globs, loop)

    def process(self, output: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        name = None
        for line in output:
            line = line.strip()
            if line.startswith("name="):
                name = line[5:].strip().lower().replace("_", "-")
            elif line.startswith("version=") and name:
                if name in found:
                    raise FactProcessError(f"more than one installed version of {name}")
                found[name] = line[8:].strip()
                name = None
        return found


class TorchCuda(FactBase[str | None]):
    """
    ``torch.version.cuda`` of the torch in ``venv`` ("13.0"; ``""`` for a CPU build), read
    from ``torch/version.py`` without importing torch (that needs the CUDA libraries), or
    ``None`` when there is no torch.
    """

    def command(self, venv: str) -> StringCommand:
        version_py = _venv_glob(venv, "torch/version.py")
        # version.py only imports typing: run it on its own with the venv's python.
        run = (
            '; do test -f "$f" && "$py" -I -c "import runpy, sys; '
            "print('cuda=' + (runpy.run_path(sys.argv[1])['cuda'] or ''))\" \"$f\"; done; true"
        )
        py = StringCommand("py=", QuoteString(f"{venv.rstrip('/')}/bin/python"), _separator="")
        return StringCommand(py, "; for f in", version_py, run)

    def process(self, output: list[str]) -> str | None:
        values = [line.strip()[5:] for line in output if line.strip().startswith("cuda=")]
        if len(values) > 1:
            raise FactProcessError(f"more than one torch/version.py: {values}")
        return values[0] if values else None


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
