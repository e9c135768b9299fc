"""Facts about a Python venv on a node, read from its files without importing anything from it.

Each fact answers one question by looking at the venv's files, never by importing the package
(importing torch takes seconds and needs the CUDA libraries).

    host.get_fact(DistVersions, venv="/opt/servefleet/tools/venv", names=("uv",))  # {"uv": "0.13.9"}
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

# Relative to a venv: where pip puts packages (venv/lib/python3.X/site-packages).
SITE_PACKAGES_GLOB = "lib/python3.*/site-packages"


class Several(str):
    """A fact's answer when the venv holds more than one (e.g. two python3.* site-packages):
    the operations refuse to guess which one runs, and say so (a FactProcessError would end
    the whole run where the host is the last one left)."""


def only_one(output: list[str], what: str) -> str | None:
    """The single non-empty line of `output`, None for none, Several(...) for more."""
    found = [line.strip() for line in output if line.strip()]
    if len(found) > 1:
        return Several(f"more than one {what}: {', '.join(found)}")
    return found[0] if found else None


def venv_glob(venv: str, pattern: str) -> StringCommand:
    """The quoted venv followed by an unquoted glob, so the shell expands only the glob."""
    return StringCommand(
        QuoteString(venv.rstrip("/")), f"/{SITE_PACKAGES_GLOB}/{pattern}", _separator=""
    )


class DistVersions(FactBase[dict[str, str]]):
    """
    ``{distribution: version}`` of the given distributions installed in ``venv``, read from
    their ``*.dist-info/METADATA`` headers (no import); a missing one is absent from the dict.

        host.get_fact(DistVersions, venv="/opt/servefleet/venvs/vllm-0.24.0",
                      names=("torch", "vllm"))   # {"torch": "2.11.0", "vllm": "0.24.0"}
    """

    default = dict  # no output: nothing installed

    def command(self, venv: str, names: tuple[str, ...] = ()) -> StringCommand:
        # dist-info directories use the normalised name with "_" (e.g. flash_attn-2.8.dist-info).
        globs = [venv_glob(venv, f"{n.replace('-', '_')}-*.dist-info/METADATA") for n in names]
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
        version_py = venv_glob(venv, "torch/version.py")
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
