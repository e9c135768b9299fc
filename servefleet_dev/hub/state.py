"""What every listening socket of one hub process shares: the store, byte counters, fault rules."""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field

from servefleet_dev.hub.store import HubStore


class Stats:
    """Body bytes served: what a benchmark reports as "upstream bytes"."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.total_bytes = 0
            self.api_bytes = 0
            self.requests = {"resolve_head": 0, "resolve_get": 0, "api": 0, "errors": 0}
            self.repos: dict[str, int] = {}
            self.files: dict[str, dict[str, int]] = {}

    def count_request(self, kind: str, file_key: str | None = None, ranged: bool = False) -> None:
        with self._lock:
            self.requests[kind] += 1
            if file_key is not None:
                f = self.files.setdefault(file_key, {"bytes": 0, "gets": 0, "range_gets": 0})
                f["gets"] += 1
                f["range_gets"] += int(ranged)

    def add_bytes(self, repo_key: str, file_key: str, n: int) -> None:
        with self._lock:
            self.total_bytes += n
            self.repos[repo_key] = self.repos.get(repo_key, 0) + n
            self.files[file_key]["bytes"] += n

    def add_api_bytes(self, n: int) -> None:
        with self._lock:
            self.api_bytes += n

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "total_bytes": self.total_bytes,
                "api_bytes": self.api_bytes,
                "requests": dict(self.requests),
                "repos": dict(self.repos),
                "files": {k: dict(v) for k, v in self.files.items()},
            }


@dataclass
class FaultRule:
    """Applies to GETs of files whose "org/name/path" matches pattern (fnmatch).

    bytes_per_second throttles the body (read live, so clearing the rule speeds up a transfer in
    flight); drop_after closes the connection after that many body bytes of a response, which the
    client sees as a broken transfer; times limits how many responses the rule affects.
    """

    pattern: str = "*"
    bytes_per_second: int | None = None
    drop_after: int | None = None
    times: int | None = None
    active: bool = field(default=True, compare=False)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("pattern", "bytes_per_second", "drop_after", "times")}

    @classmethod
    def from_json(cls, doc) -> FaultRule:
        """A rule from the operator endpoint's JSON; ValueError names what is wrong with it."""
        if not isinstance(doc, dict):
            raise ValueError("expected a JSON object")
        pattern = doc.get("pattern") or "*"
        if not isinstance(pattern, str):
            raise ValueError("pattern: expected a string")
        times = _opt_int(doc, "times")
        if times == 0:
            raise ValueError("times: expected >= 1 (leave it out for no limit)")
        return cls(pattern, _opt_int(doc, "bytes_per_second"), _opt_int(doc, "drop_after"), times)


def _opt_int(doc: dict, key: str) -> int | None:
    """doc[key] as a count: absent/null, or an integer >= 0 (not a float, bool or string)."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}: expected an integer >= 0, got {value!r}")
    return value


class Faults:
    def __init__(self):
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def set(self, rule: FaultRule) -> None:
        """Add a rule, replacing any with the same pattern."""
        with self._lock:
            for old in self._rules:
                if old.pattern == rule.pattern:
                    old.active = False
            self._rules = [r for r in self._rules if r.active] + [rule]

    def clear(self) -> None:
        with self._lock:
            for rule in self._rules:
                rule.active = False
            self._rules = []

    def begin(self, file_key: str) -> FaultRule | None:
        """The rule governing one response (the newest match), counting it against `times`."""
        with self._lock:
            for rule in reversed(self._rules):
                if rule.active and fnmatch.fnmatchcase(file_key, rule.pattern):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            rule.active = False
                            self._rules.remove(rule)
                    return rule
        return None

    def to_json(self) -> list[dict]:
        with self._lock:
            return [r.to_json() for r in self._rules]


@dataclass
class HubState:
    """What every listening socket of one hub process shares."""

    store: HubStore
    token: str | None = None
    verbose: bool = False
    stats: Stats = field(default_factory=Stats)
    faults: Faults = field(default_factory=Faults)
