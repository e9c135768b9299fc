"""Facts of models on a node: the record a verified download left (servefleet.core.models), and
the files of a model directory as its owner reads them.

A model directory is the engine's to write (the models root is in its ReadWritePaths), so root
never reads it with root's power: listings and reads run as the service user (`runuser`), follow
no symlink, and are bounded. The "verified" record that says a directory is complete lives in
root's state/ (NodeLayout.model_record), where the engine cannot forge it.
"""

from __future__ import annotations

import shlex
from typing import TypeVar

from pyinfra.api import FactBase

from servefleet.core import node_output, records
from servefleet.core.layout import NodeLayout
from servefleet.core.models import SIZES_MARKER, parse_verified, split_record

FILE_MARKER = "#servefleet-file"
READ_TIMEOUT_S = 20  # a FIFO or a slow device swapped in cannot hold the run longer


def record_args(data, dest: str) -> dict:
    """The keyword arguments of VerifiedModel / ModelRecordFiles for a model in dest: plan and
    read with the same ones (servefleet.facts.batch keys facts by them)."""
    lay = NodeLayout.of(data)
    return {"path": dest, "record": lay.model_record(dest), "user": lay.user}


def _as_user(user: str, script: str, *args: str) -> str:
    """`script` run by sh as user when the account exists (on a bare node it does not yet, and
    nothing of it exists either)."""
    u = shlex.quote(user)
    return (
        f"if id -u {u} >/dev/null 2>&1; then runuser -u {u} -- timeout {READ_TIMEOUT_S} "
        f"sh -c {shlex.quote(script)} sh {' '.join(shlex.quote(a) for a in args)}; fi"
    )


# Lists every entry that is not a directory (a planted symlink or FIFO counts as an unlisted
# file), skipping servefleet's and hf's own folders and rsync's partial files.
# Names as bytes: NUL after each, base64 on the wire (core.node_output), bounded.
_LIST = (
    'cd "$1" 2>/dev/null || exit 0; find . \\( -path ./.servefleet -o -path ./.cache '
    "-o -name .rsync-partial \\) -prune -o ! -type d -printf '%s %P\\0' "
    f"| head -c {node_output.MAX_LISTING + 1} | {node_output.ENCODE}"
)


T = TypeVar("T")


class _ModelRecordBase(FactBase[T]):
    def command(self, path: str, record: str, user: str) -> str:
        r = shlex.quote(record)
        return (
            f"if [ -f {r} ] && [ ! -L {r} ]; then head -c {records.MAX_BYTES + 1} {r} "
            f"| {node_output.ENCODE}; echo '{SIZES_MARKER}'; {_as_user(user, _LIST, path)}; fi"
        )


class VerifiedModel(_ModelRecordBase[dict | None]):
    """The record a verified download left for path in root's state (repo_id, revision, sha,
    include, files {path: size}, sha256 {path: hex}, source, verified_at), or None: no record,
    a recorded file is now missing or of another size (truncated), or the directory holds a
    file the record does not list."""

    def process(self, output: list[str]) -> dict | None:
        return parse_verified(output)


class ModelRecordFiles(_ModelRecordBase[tuple[dict | None, dict[str, int]]]):
    """The raw read: (record or None, {path: size on disk}), to say why a record is invalid."""

    @staticmethod
    def default() -> tuple[dict | None, dict[str, int]]:
        return None, {}

    def process(self, output: list[str]) -> tuple[dict | None, dict[str, int]]:
        return split_record(output)


# A regular file, read without following a symlink (dd's O_NOFOLLOW) or blocking on a FIFO
# (O_NONBLOCK), one byte past the bound so that a larger file is told apart.
_READ = (
    f'f="$1"; if [ -L "$f" ]; then echo \'{FILE_MARKER} symlink\'; '
    f'elif [ ! -e "$f" ]; then :; '
    f"elif [ ! -f \"$f\" ]; then echo '{FILE_MARKER} not-regular'; "
    f"else echo '{FILE_MARKER} ok'; dd if=\"$f\" iflag=nofollow,nonblock,count_bytes "
    f'count="$2" status=none | {node_output.ENCODE}; fi'
)


# A ModelFile answer when the file is there: (why it was not read, None) or (None, its text).
FileRead = tuple[str, None] | tuple[None, str]


class ModelFile(FactBase[FileRead | None]):
    """A file of a model directory, read as its owner: None when absent, else (problem, text):
    problem is None or why it was not read (a symlink, not a regular file, larger than
    max_bytes)."""

    def command(self, path: str, user: str, max_bytes: int) -> str:
        return _as_user(user, _READ, path, str(int(max_bytes) + 1))

    def process(self, output: list[str]) -> FileRead | None:
        if not output or not output[0].startswith(FILE_MARKER):
            return None
        status = output[0][len(FILE_MARKER) :].strip()
        if status != "ok":
            return (f"{status.replace('-', ' ')}: refused", None)
        try:  # the bytes as they are on disk (base64): text only when they are UTF-8
            return None, node_output.decode(output[1:], "a model file").decode("utf-8")
        except UnicodeDecodeError:
            return ("not UTF-8 text: refused", None)
        except node_output.NodeOutputError as exc:
            return (f"{exc}: refused", None)


def file_problem(result: FileRead | None, max_bytes: int) -> tuple[str | None, str | None]:
    """(problem, text) of a ModelFile result read with max_bytes (None: the file is absent)."""
    if result is None:
        return None, None
    if result[0] is None and len(result[1].encode()) > max_bytes:
        return f"larger than {max_bytes} bytes: refused", None
    return result
