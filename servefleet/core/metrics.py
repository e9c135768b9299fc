"""servefleet's own state of a node as Prometheus metrics: a node_exporter textfile
(`{metrics_textfile_dir}/servefleet.prom`), rendered from root's records on the node.

What it shows comes from the records the verbs keep anyway: the release serving, the previous
one and the one rolled back from (state/releases.json, core.releases), the performance gate's
last figures of each kept release (Release.perf), and the last health and drift checks
(state/checks.json, `Checks` below: the one thing no other record holds). Converge, drift, the
health gate and the performance gate update the records and write the file again
(servefleet.verbs.metrics, servefleet.operations.metrics).

The text is Prometheus's text exposition format (version 0.0.4): one HELP and TYPE line per
family, its samples together, label values escaped (backslash, double quote, newline) and
stripped of other control characters, no sample timestamps (node_exporter refuses them in a
textfile): the time of a check is a sample's value, in unix seconds.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from dataclasses import dataclass

from servefleet.core import records as rc
from servefleet.core.perf import Figures
from servefleet.core.records import RecordError
from servefleet.core.releases import Release, Releases

LABEL_MAX = 256  # characters of a label value (a model repo, a version)
AT_MAX = 2**40  # a unix time a record may hold

# (name, type, help) of each family, in the order the file lists them.
FAMILIES = (
    ("servefleet_records_readable", "gauge", "1: the release records could be read"),
    ("servefleet_release_info", "gauge", "Releases the node keeps, by role"),
    ("servefleet_health_ok", "gauge", "1: the last health check passed"),
    ("servefleet_health_checked_timestamp_seconds", "gauge", "Last health check"),
    ("servefleet_drift_in_sync", "gauge", "1: the last drift check found it in sync"),
    ("servefleet_drift_checked_timestamp_seconds", "gauge", "Last drift check"),
    ("servefleet_gate_decode_tokens_per_second", "gauge", "Gate's median decode tok/s"),
    ("servefleet_gate_ttft_seconds", "gauge", "Gate's median time to first token"),
    ("servefleet_gate_measured_timestamp_seconds", "gauge", "When the gate measured"),
)

# Characters a label value never carries as they are: C0 and C1 controls but the newline
# (escaped), U+2028/U+2029, and lone surrogates (not UTF-8).
_UNSHOWN = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def escape_label(value: str) -> str:
    """A label value as the text format writes it between double quotes: backslash, double
    quote and newline escaped; other control characters and lone surrogates become U+FFFD;
    at most LABEL_MAX characters."""
    value = _UNSHOWN.sub("\ufffd", str(value)[:LABEL_MAX])
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A HELP line's text: backslash and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float | int | bool) -> str | None:
    """A sample value as the format writes it; None for a value that is not a finite number."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def unix_time(iso: str) -> int | None:
    """'2026-12-06T16:30:07Z' (what the records write) as unix seconds; None otherwise."""
    try:
        return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Checks:
    """The last health and drift checks of a node (state/checks.json): passed or not, when."""

    health_ok: bool | None = None
    health_at: int | None = None
    drift_in_sync: bool | None = None
    drift_at: int | None = None

    def dumps(self) -> str:
        doc = {}
        if self.health_ok is not None:
            doc["health"] = {"ok": self.health_ok, "at": self.health_at}
        if self.drift_in_sync is not None:
            doc["drift"] = {"in_sync": self.drift_in_sync, "at": self.drift_at}
        return json.dumps(doc, sort_keys=True) + "\n"

    @classmethod
    def loads(cls, text: str) -> Checks:
        """The checks of checks.json's text (none for an empty file); RecordError."""
        what = "checks.json"
        doc = rc.load(text, what)
        if doc is None:
            return cls()
        rc.only_keys(doc, ("health", "drift"), what)
        health = _check(doc.get("health"), "ok", f"{what}'s health")
        drift = _check(doc.get("drift"), "in_sync", f"{what}'s drift")
        return cls(health[0], health[1], drift[0], drift[1])


def _check(doc, key: str, what: str) -> tuple[bool | None, int | None]:
    if doc is None:
        return None, None
    rc.only_keys(doc, (key, "at"), what)
    passed, at = doc.get(key), doc.get("at")
    if not isinstance(passed, bool):
        raise RecordError(f"{what}: {key!r} is not true or false")
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= AT_MAX:
        raise RecordError(f"{what}: 'at' is not a unix time")
    return passed, at


def _labels(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs) + "}"


def _release_labels(rel: Release) -> list[tuple[str, str]]:
    return [("release", rel.id), ("engine", rel.engine), ("version", rel.version)]


def render(releases: Releases, checks: Checks) -> str:
    """The textfile for these records: valid text exposition, one family after another."""
    samples: dict[str, list[tuple[str, str]]] = {name: [] for name, _, _ in FAMILIES}

    def add(name: str, labels: list[tuple[str, str]], value) -> None:
        shown = number(value)
        if shown is not None:
            samples[name].append((_labels(labels) if labels else "", shown))

    add("servefleet_records_readable", [], releases.unreadable is None)
    roles = [
        ("serving", releases.current),
        ("previous", releases.previous_release),
        ("rolled_back_from", releases.rolled_back_from),
    ]
    for role, rel in roles:
        if rel is not None:
            rev = rel.model_sha[:12] if rel.model_sha else rel.model_revision
            labels = [("role", role), *_release_labels(rel), ("model", rel.model_repo)]
            add("servefleet_release_info", [*labels, ("model_revision", rev)], 1)
    if checks.health_ok is not None:
        add("servefleet_health_ok", [], checks.health_ok)
        add("servefleet_health_checked_timestamp_seconds", [], checks.health_at)
    if checks.drift_in_sync is not None:
        add("servefleet_drift_in_sync", [], checks.drift_in_sync)
        add("servefleet_drift_checked_timestamp_seconds", [], checks.drift_at)
    seen = set()
    for rel in releases.kept():
        fig = Figures.from_json(rel.perf) if rel.perf else None
        if fig is None or rel.id in seen:
            continue
        seen.add(rel.id)
        labels = [*_release_labels(rel), ("kind", fig.kind or "gate")]
        if fig.decode_tok_s is not None:
            add("servefleet_gate_decode_tokens_per_second", labels, fig.decode_tok_s)
        add("servefleet_gate_ttft_seconds", labels, fig.ttft_s)
        measured = unix_time(fig.measured_at)
        if measured is not None:
            add("servefleet_gate_measured_timestamp_seconds", labels, measured)
    lines = []
    for name, kind, text in FAMILIES:
        if samples[name]:
            lines += [f"# HELP {name} {escape_help(text)}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{labels} {value}" for labels, value in samples[name]]
    return "\n".join(lines) + "\n"
