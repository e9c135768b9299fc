"""Facts of the llama.cpp recipe: installed builds, the CUDA compiler, the GGUF lint."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from servefleet.engines.llamacpp.logic import Builds, Lint, parse_builds, parse_lint, parse_nvcc


class LlamaBuilds(FactBase[Builds]):
    """The llama.cpp builds installed under `llama_dir` (each prefix's build.json) and where
    its `current` link points."""

    def command(self, llama_dir: str) -> str:
        d = shlex.quote(llama_dir)
        return (
            f'for f in {d}/*/build.json; do [ -f "$f" ] && '
            'printf "build %s %s\\n" "$(basename "$(dirname "$f")")" "$(tr -d "\\n" < "$f")"; '
            f'done; printf "current %s\\n" "$(readlink {d}/current 2>/dev/null)"; true'
        )

    def process(self, output: list[str]) -> Builds:
        return parse_builds(output)


class Nvcc(FactBase[dict | None]):
    """The CUDA compiler: on PATH or in /usr/local/cuda/bin; None when there is none."""

    def command(self) -> str:
        return (
            'for n in nvcc /usr/local/cuda/bin/nvcc; do p=$(command -v "$n") && '
            '{ echo "$p"; "$p" --version; break; }; done; true'
        )

    def process(self, output: list[str]) -> dict | None:
        return parse_nvcc(output)


class GgufLint(FactBase[Lint]):
    """The GGUF lint (servefleet/core/lint/gguf_lint.py) of a file on the node, run as the
    service user: the file is the service's, and root never parses what it can write.

    `Lint.flag` is the one comma-separated --override-kv value, None for a correct file.
    """

    def command(self, python: str, script: str, path: str, user: str) -> str:
        py, sc, p, u = (shlex.quote(x) for x in (python, script, path, user))
        # gguf installed: its package in the venv (a file test, not a Python importing numpy for
        # each read; an install that is there but broken fails the lint itself, as an error).
        venv = shlex.quote(python.rsplit("/bin/", 1)[0])
        return (
            f"if [ ! -f {p} ]; then echo absent; "
            f"elif [ ! -x {py} ] || [ ! -f {sc} ] || "
            f"! ls {venv}/lib/python3*/site-packages/gguf/__init__.py >/dev/null 2>&1; "
            "then echo nolint; "
            f"elif out=$(runuser -u {u} -- {py} -I {sc} --flag {p} 2>&1); then "
            'echo "ok $out"; else echo "error $out"; fi'
        )

    def process(self, output: list[str]) -> Lint:
        return parse_lint(output)
