"""Releases on a node: what serves, recorded after every successful converge of a serving
recipe, so that the previous one can be served again without downloading or building.

A release is the engine and its version, the venv or build prefix, the unit file's content,
the model (repo, revision, sha, directory) and the digest of the data that changes what serves.
`{root}/state/releases.json` keeps the current release, the previous ones (newest first, as
many as `releases_keep` allows, current included) and, after a rollback, the release rolled
back from. Everything a kept release names stays on disk; the rest is pruned.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import asdict, dataclass, field, replace

from servefleet.core import records as rc
from servefleet.core.records import RecordError

# What a rollback says of a host that keeps no release before its current one (verbs/rollback.py
# reads it: such a host was not rolled back, and is not broken).
NO_PREVIOUS = "has no previous release to roll back to"

# The engine a release names (Engine.label, servefleet.engines): a short lowercase name. Which
# engines exist is the registry's to say; the verbs refuse a release of none of them.
ENGINE_LABEL = re.compile(r"[a-z][a-z0-9._-]{0,31}")
# A release's health check, as recipes/serving.py gate_args writes it: key -> allowed types.
GATE_TYPES: dict[str, type | tuple[type, ...]] = {
    "script": str,
    "python": str,
    "url": str,
    "model": str,
    "unit": str,
    "key_file": (str, type(None)),
    "timeout_s": int,
    "settle_s": int,
    "expect_stopped": bool,
    "kv_config": (str, type(None)),
    "kv_data": (dict, type(None)),
    "engine_version": (str, type(None)),
    "kv_user": str,
}
GATE_SECONDS_MAX = 7 * 86400  # the data's bound on any wait (core.validate.SECONDS_MAX)
MAX_KEPT = 64  # previous releases a record may list (releases_keep is far below)


@dataclass(frozen=True)
class Release:
    engine: str  # Engine.label of the engine that serves it
    version: str  # "0.24.0" | "b9785"
    prefix: str  # the venv or the build prefix
    unit: str  # unit name
    unit_text: str  # the unit file as installed: restoring it serves this release again
    model_repo: str
    model_revision: str
    model_sha: str | None
    model_dir: str
    data_digest: str
    commit: str | None = None  # llama.cpp: the source commit
    gate: dict = field(default_factory=dict)  # its health check's arguments (operations.health)
    recorded_at: str = ""
    # The last bench figures measured on it by a performance-gated rollout (core.perf.Figures
    # as JSON); measured, not what serves: not part of the id.
    perf: dict | None = None
    # The sandbox probe's command for its unit (servefleet.core.sandbox): a rollback runs it
    # under this unit's sandbox before restarting into it. Derived from what serves, not part
    # of the id (releases recorded before it existed keep theirs).
    probe_argv: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        doc = {
            k: v for k, v in asdict(self).items() if k not in ("recorded_at", "perf", "probe_argv")
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def short(self) -> str:
        """For 80 columns: "vllm 0.24.0", "llama.cpp b9785"."""
        return f"{self.engine} {self.version}"

    @property
    def describe(self) -> str:
        rev = self.model_sha[:12] if self.model_sha else self.model_revision
        return f"{self.short} ({self.id}), {self.model_repo}@{rev}"

    def paths(self) -> set[str]:
        return {self.prefix, self.model_dir}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc, what: str = "a release") -> Release | None:
        """The release a record holds (None for null); RecordError when a field is not what
        servefleet writes: its unit is installed, its prefix linked and its gate run by root."""
        if doc is None:
            return None
        rc.only_keys(doc, cls.__dataclass_fields__, what)
        engine = doc.get("engine")
        if not isinstance(engine, str) or not ENGINE_LABEL.fullmatch(engine):
            raise RecordError(f"{what}: 'engine' is not an engine's name")
        gate = doc.get("gate", {})
        rc.only_keys(gate, GATE_TYPES, f"{what}'s gate")
        for key, value in gate.items():
            kinds = GATE_TYPES[key]
            if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is int):
                raise RecordError(f"{what}'s gate: {key!r} has the wrong type")
            if isinstance(value, int) and kinds is int and not 0 <= value <= GATE_SECONDS_MAX:
                raise RecordError(f"{what}'s gate: {key!r} is out of range (0..{GATE_SECONDS_MAX})")
        perf, argv = doc.get("perf"), doc.get("probe_argv", [])
        if perf is not None and not isinstance(perf, dict):
            raise RecordError(f"{what}: 'perf' is not an object")
        if not (
            isinstance(argv, (list, tuple))
            and len(argv) <= 64
            and all(isinstance(a, str) and len(a) <= 4096 for a in argv)
        ):
            raise RecordError(f"{what}: 'probe_argv' is not a list of words")
        return cls(
            engine=engine,
            version=rc.text(doc, "version", what, 64),
            prefix=rc.abs_path(doc, "prefix", what),
            unit=rc.unit_name(doc, "unit", what),
            unit_text=_unit_text(doc, what),
            model_repo=rc.text(doc, "model_repo", what),
            model_revision=rc.text(doc, "model_revision", what, 128),
            model_sha=rc.hex_text(doc, "model_sha", what, (40, 64), optional=True),
            model_dir=rc.abs_path(doc, "model_dir", what),
            data_digest=rc.text(doc, "data_digest", what, 128),
            commit=rc.hex_text(doc, "commit", what, tuple(range(7, 65)), optional=True),
            gate=gate,
            recorded_at=rc.text(doc, "recorded_at", what, 64) or "",
            perf=perf,
            probe_argv=tuple(argv),
        )


def _unit_text(doc: dict, what: str) -> str:
    value = doc.get("unit_text")
    if not isinstance(value, str) or len(value) > 256 * 1024 or "\x00" in value:
        raise RecordError(f"{what}: 'unit_text' is not a unit file's text")
    return value


def _unit_lines(rel: Release) -> list[str]:
    """The unit's settings and ExecStart words, one per line as the unit writes them."""
    lines = (ln.strip().removesuffix("\\").strip() for ln in rel.unit_text.splitlines())
    return [ln for ln in lines if ln and not ln.startswith(("#", "["))]


def what_differs(ref: Release, other: Release) -> str:
    """other's name for a table, with what sets it apart from ref where the names are the same
    ("llama.cpp b9785: unit +--ubatch-size 1"): the commit, the model, the unit's lines, else
    the data."""
    if other.short != ref.short:
        return other.short
    parts = []
    if other.commit != ref.commit:
        parts.append(f"commit {str(other.commit)[:9]}")
    if (other.model_repo, other.model_sha) != (ref.model_repo, ref.model_sha):
        rev = other.model_sha[:12] if other.model_sha else other.model_revision
        parts.append(f"model {other.model_repo}@{rev}")
    mine, theirs = _unit_lines(ref), _unit_lines(other)
    changed = [f"+{ln}" for ln in theirs if ln not in mine] + [
        f"-{ln}" for ln in mine if ln not in theirs
    ]
    if changed:
        more = f" (+{len(changed) - 2} more)" if len(changed) > 2 else ""
        parts.append("unit " + ", ".join(c[:40] for c in changed[:2]) + more)
    if not parts:
        parts.append("other data" if other.data_digest != ref.data_digest else "same")
    return f"{other.short}: {'; '.join(parts)}"


@dataclass(frozen=True)
class Releases:
    current: Release | None = None
    previous: tuple[Release, ...] = ()  # newest first
    rolled_back_from: Release | None = None
    # Set when releases.json is there but cannot be read (core.records): no record is known,
    # and nothing may be written over it or rolled back from it.
    unreadable: str | None = None

    def to_json(self) -> dict:
        return {
            "current": self.current.to_json() if self.current else None,
            "previous": [r.to_json() for r in self.previous],
            "rolled_back_from": self.rolled_back_from.to_json() if self.rolled_back_from else None,
        }

    @classmethod
    def from_json(cls, doc) -> Releases:
        """The release records (releases.json); RecordError where a part is not servefleet's."""
        rc.only_keys(doc, ("current", "previous", "rolled_back_from"), "the release records")
        previous = doc.get("previous") or []
        if not isinstance(previous, list) or len(previous) > MAX_KEPT:
            raise RecordError(
                f"the release records: 'previous' is not a list of at most {MAX_KEPT}"
            )
        read = tuple(
            Release.from_json(d, f"previous release {i + 1}") for i, d in enumerate(previous)
        )
        kept = tuple(r for r in read if r is not None)
        if len(kept) != len(read):
            raise RecordError("the release records: a previous release is null")
        return cls(
            Release.from_json(doc.get("current"), "the current release"),
            kept,
            Release.from_json(doc.get("rolled_back_from"), "the release rolled back from"),
        )

    @classmethod
    def loads(cls, text: str) -> Releases:
        """The release records of a text (none for an empty file); RecordError."""
        doc = rc.load(text, "the release records")
        return cls() if doc is None else cls.from_json(doc)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    @property
    def previous_release(self) -> Release | None:
        return self.previous[0] if self.previous else None

    def kept(self) -> list[Release]:
        return [r for r in (self.current, *self.previous, self.rolled_back_from) if r]

    def kept_paths(self) -> set[str]:
        return {p for r in self.kept() for p in r.paths()}


def record(releases: Releases, new: Release, keep: int) -> tuple[Releases, list[Release]]:
    """`new` as the current release; the old current becomes the newest previous one.
    Returns the new records and the releases dropped beyond `keep` (current included)."""
    if releases.current and releases.current.id == new.id:
        return releases, []
    measured = next((r.perf for r in releases.kept() if r.id == new.id and r.perf), None)
    if measured and new.perf is None:  # a kept release again: its last figures stay with it
        new = replace(new, perf=measured)
    previous = [
        r
        for r in ((releases.current,) if releases.current else ()) + releases.previous
        if r.id != new.id
    ]
    kept, dropped = previous[: max(keep - 1, 0)], previous[max(keep - 1, 0) :]
    rolled = releases.rolled_back_from
    if rolled and rolled.id != new.id:
        dropped.append(rolled)  # a new release replaces the one rolled back from
    return Releases(new, tuple(kept), None), dropped


def rollback(releases: Releases) -> Releases | None:
    """The records after going back to the previous release; None when there is none."""
    if not releases.previous:
        return None
    return Releases(releases.previous[0], releases.previous[1:], releases.current)


def prune_candidates(releases: Releases, dropped: list[Release]) -> list[str]:
    """Directories of dropped releases that no kept release uses."""
    kept = releases.kept_paths()
    out = []
    for r in dropped:
        for p in sorted(r.paths()):
            if p not in kept and p not in out:
                out.append(p)
    return out


def with_perf(releases: Releases, release_id: str, perf: dict) -> Releases | None:
    """The records with `perf` on the kept release of that id (None when none has it)."""
    found = False

    def put(r: Release) -> Release:
        nonlocal found
        if r.id == release_id:
            found = True
            return replace(r, perf=perf)
        return r

    def put_optional(r: Release | None) -> Release | None:
        return None if r is None else put(r)

    updated = Releases(
        put_optional(releases.current),
        tuple(put(r) for r in releases.previous),
        put_optional(releases.rolled_back_from),
    )
    return updated if found else None


def with_time(release: Release, when: str) -> Release:
    return replace(release, recorded_at=when)


def bounded(path: str, parents: list[str]) -> bool:
    """Is `path` strictly inside one of `parents` (normalised)? Pruning deletes nothing else."""
    p = posixpath.normpath(path)
    return any(
        p != posixpath.normpath(q) and p.startswith(posixpath.normpath(q) + "/") for q in parents
    )


@dataclass
class RolloutMarker:
    """The in-progress marker of a rollout on a node (state/rollout.json)."""

    rollout_id: str
    target_digest: str
    phase: str  # converging | gating | rolling-back
    from_release: str | None = None
    started_at: str = ""
    extra: dict = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def loads(cls, text: str) -> RolloutMarker | None:
        """The marker of rollout.json's text (None for an empty file); RecordError."""
        what = "rollout.json"
        doc = rc.load(text, what)
        if doc is None:
            return None
        rc.only_keys(doc, cls.__dataclass_fields__, what)
        if doc.get("phase") not in ("converging", "gating", "rolling-back"):
            raise RecordError(f"{what}: 'phase' is not converging, gating or rolling-back")
        extra = doc.get("extra", {})
        if not isinstance(extra, dict):
            raise RecordError(f"{what}: 'extra' is not an object")
        return cls(
            rollout_id=rc.text(doc, "rollout_id", what, 128),
            target_digest=rc.text(doc, "target_digest", what, 128),
            phase=doc["phase"],
            from_release=rc.text(doc, "from_release", what, 128, optional=True),
            started_at=rc.text(doc, "started_at", what, 64, optional=True) or "",
            extra=extra,
        )
