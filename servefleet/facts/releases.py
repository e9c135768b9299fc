"""The node's release records (servefleet.core.releases), read from its state dir. Each is read
only when it is a regular file (core.records.read_command) and parsed strictly; a record that is
there but cannot be read is reported as such, never as an empty one."""

from __future__ import annotations

from pyinfra.api import FactBase

from servefleet.core import records as rc
from servefleet.core.metrics import Checks
from servefleet.core.releases import Releases, RolloutMarker
from servefleet.core.rollout_record import WHAT, LastRollout


class RunningRelease(FactBase[str | rc.Unreadable | None]):
    """The id of the release the service was last started with and found healthy, or None;
    core.records.Unreadable when running.json is there but is not {"release": "<12 hex>"}."""

    def command(self, path: str) -> str:
        return rc.read_command(path)

    def process(self, output: list[str]) -> str | rc.Unreadable | None:
        try:
            doc = rc.load(rc.from_node(output, "running.json"), "running.json")
            if doc is None:
                return None
            rc.only_keys(doc, ("release",), "running.json")
            return rc.hex_text(doc, "release", "running.json", (12,))
        except rc.RecordError as exc:
            return rc.Unreadable(str(exc))


class RolloutMarkerFact(FactBase[RolloutMarker | rc.Unreadable | None]):
    """The in-progress rollout marker of a node, None, or core.records.Unreadable."""

    def command(self, path: str) -> str:
        return rc.read_command(path)

    def process(self, output: list[str]) -> RolloutMarker | rc.Unreadable | None:
        try:
            return RolloutMarker.loads(rc.from_node(output, "rollout.json"))
        except rc.RecordError as exc:
            return rc.Unreadable(str(exc))


class LastRolloutFact(FactBase[LastRollout | rc.Unreadable | None]):
    """What the last rollout did on a node (state/last-rollout.json), None when no rollout
    ended there, or core.records.Unreadable."""

    def command(self, path: str) -> str:
        return rc.read_command(path)

    def process(self, output: list[str]) -> LastRollout | rc.Unreadable | None:
        try:
            return LastRollout.loads(rc.from_node(output, WHAT))
        except rc.RecordError as exc:
            return rc.Unreadable(str(exc))


class NodeReleases(FactBase[Releases]):
    """The releases.json of a node as `Releases`: empty when there is none, with `unreadable`
    set when it is there but cannot be read."""

    default = Releases

    def command(self, path: str) -> str:
        return rc.read_command(path)

    def process(self, output: list[str]) -> Releases:
        try:
            return Releases.loads(rc.from_node(output, "the release records"))
        except rc.RecordError as exc:
            return Releases(unreadable=str(exc))


class NodeChecks(FactBase[Checks]):
    """The node's last health and drift checks (state/checks.json) as core.metrics.Checks:
    none when there is no record, and none (rewritten by the next check) when it is unreadable:
    it only feeds the metrics textfile."""

    default = Checks

    def command(self, path: str) -> str:
        return rc.read_command(path)

    def process(self, output: list[str]) -> Checks:
        try:
            return Checks.loads(rc.from_node(output, "checks.json"))
        except rc.RecordError:
            return Checks()
