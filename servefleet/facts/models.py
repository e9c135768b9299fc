"""Facts of models on a node: the record a verified download left (servefleet.core.models)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from servefleet.core.models import RECORD, SIZES_MARKER, parse_verified, split_record


class _ModelRecordBase(FactBase):
    def command(self, path):
        q = shlex.quote(path)
        return (f"if [ -f {q}/{RECORD} ]; then cat {q}/{RECORD}; echo; echo '{SIZES_MARKER}'; "
                f"cd {q} && find . -path ./.servefleet -prune -o -path ./.cache -prune "
                "-o -type f -printf '%s %P\\n'; fi")


class VerifiedModel(_ModelRecordBase):
    """The record a verified download left in path (repo_id, revision, sha, include, files
    {path: size}, sha256 {path: hex}, source, verified_at), or None: no record, or a recorded
    file is now missing or of another size (truncated)."""

    def process(self, output):
        return parse_verified(output)


class ModelRecordFiles(_ModelRecordBase):
    """The raw read: (record or None, {path: size on disk}), to say why a record is invalid."""

    @staticmethod
    def default():
        return None, {}

    def process(self, output):
        return split_record(output)
