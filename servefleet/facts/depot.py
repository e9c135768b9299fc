"""Facts read on the depot host."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from servefleet.core.models import SHA_RE


class DepotRef(FactBase[str | None]):
    """The commit sha the depot holds verified at a ref file, or None."""

    def command(self, ref_file: str) -> str:
        return f"cat {shlex.quote(ref_file)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        sha = "".join(output).strip()
        return sha if SHA_RE.fullmatch(sha) else None
