"""The node's release records (servefleet.core.releases), read from its state dir."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from servefleet.core.releases import Releases, RolloutMarker


class RunningRelease(FactBase):
    """The id of the release the service was last started with and found healthy, or None."""

    def command(self, path: str):
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        try:
            doc = json.loads("\n".join(output))
        except ValueError:
            return None
        return doc.get("release") if isinstance(doc, dict) else None


class RolloutMarkerFact(FactBase):
    """The in-progress rollout marker of a node, or None."""

    def command(self, path: str):
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return RolloutMarker.loads("\n".join(output))


class NodeReleases(FactBase):
    """The releases.json of a node as `Releases` (empty when there is none or it is unreadable)."""

    default = Releases

    def command(self, path: str):
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        try:
            return Releases.from_json(json.loads("\n".join(output)))
        except ValueError:
            return Releases()
