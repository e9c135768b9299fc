"""Facts about single files on a node that servefleet reads before it writes next to them."""

from __future__ import annotations

import re

from pyinfra.api import FactBase, QuoteString, StringCommand


class RegularFileSha256(FactBase[tuple[str, str | None] | None]):
    """``("file", sha256)`` of a regular file, never through a symlink; ``("absent", None)``;
    or ``(what it is, None)``: ``symbolic link``, ``directory``, ``fifo``, ... Anything but a
    regular file is only stat'ed, never opened: sha256sum would wait forever on a FIFO."""

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "f=",
            QuoteString(path),
            '; if [ -L "$f" ]; then echo "symbolic link"; elif [ -f "$f" ]; then printf "file ";'
            ' sha256sum < "$f"; elif [ -e "$f" ]; then stat -c %F -- "$f"; else echo absent; fi',
            _separator="",
        )

    def process(self, output: list[str]) -> tuple[str, str | None] | None:
        line = " ".join(output).strip()
        if line.startswith("file "):
            digest = line.split()[1]
            return ("file", digest) if re.fullmatch(r"[0-9a-f]{64}", digest) else None
        return (line, None) if line else None
