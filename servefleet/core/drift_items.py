"""Drift items: expected-vs-found pairs built from what facts read. Pure; unit-tested.

The drift check (servefleet.verbs.drift) classifies operations; these items are its deep
checks, what operations alone do not show (versions vs pins, a unit's diff, a model's sha).
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass

from servefleet.core.models import SHA_RE
from servefleet.core.python_env import public_version
from servefleet.core.releases import Releases

IN_SYNC, DRIFTED, CONDITIONAL, ALWAYS = "in_sync", "drifted", "conditional", "always_runs"
DIFF_MAX_LINES = 24


@dataclass
class Item:
    kind: str  # "operation" or "deep"
    name: str
    state: str  # in_sync | drifted | conditional | always_runs
    expected: str = ""
    found: str = ""


def item(name: str, ok: bool, expected, found) -> Item:
    """A deep item whose state is decided by `ok` (values may differ in form, e.g. labels)."""
    return Item("deep", name, IN_SYNC if ok else DRIFTED, str(expected), str(found))


def unit_diff(
    expected: str, found_lines: list[str] | None, path: str, max_lines: int = DIFF_MAX_LINES
) -> str:
    """A short unified diff from the rendered unit (-) to the node's file (+), 1 line of context."""
    if found_lines is None:
        return f"{path} is missing"
    lines = list(
        difflib.unified_diff(
            expected.splitlines(),
            list(found_lines),
            fromfile="rendered",
            tofile=path,
            lineterm="",
            n=1,
        )
    )
    body = lines[2:]  # without the ---/+++ header
    if not body:
        return f"{path} differs only in whitespace at the end of the file"
    if len(body) > max_lines:
        body = body[:max_lines] + [f"... ({len(body) - max_lines} more diff lines)"]
    return "\n".join(body)


def sha1_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def describe_sha(sha: str | None, known: dict[str, str], missing: str = "absent") -> str:
    if sha is None:
        return missing
    return f"{sha} ({known.get(sha, 'unknown content')})"


def version_items(
    venv: str, found: dict[str, str], pins: dict[str, str], cuda: str | None, wanted_cuda: str
) -> list[Item]:
    """Installed versions vs pins (a pin without a local label matches any: 2.11.0+cu130)."""
    items = [
        item(
            f"{name} version in {venv}",
            name in found and public_version(found[name]) == pin,
            pin,
            found.get(name, "not installed"),
        )
        for name, pin in pins.items()
    ]
    if "torch" in found:
        items.append(
            item(
                "torch.version.cuda", cuda == wanted_cuda, wanted_cuda, cuda or "None (a CPU build)"
            )
        )
    return items


def model_item(
    repo: str,
    revision: str,
    include: list[str],
    dest: str,
    record: dict | None,
    resolved: str | None = None,
    why_invalid: str = "",
) -> Item:
    """The model in dest verified at the pinned revision.

    A 40-hex revision must be the recorded sha. A branch or tag is shown as the expected label
    (with the sha it resolves to now, when known) and the recorded sha as found.
    """
    name = f"model {repo} in {dest}"
    pinned = bool(SHA_RE.fullmatch(revision))
    expected = f"{repo}@{revision}" if pinned or not resolved else f"{repo}@{revision} = {resolved}"
    if not record:
        return item(name, False, expected, f"no verified copy ({why_invalid or 'no record'})")
    found = f"{record.get('repo_id')}@{record.get('revision')} = {record.get('sha')}"
    ok = (
        record.get("repo_id") == repo
        and sorted(record.get("include") or []) == sorted(include)
        and (
            record.get("sha") == revision
            if pinned
            else record.get("revision") == revision
            and (resolved is None or record.get("sha") == resolved)
        )
    )
    if sorted(record.get("include") or []) != sorted(include):
        found += f" (include {record.get('include')}, data says {list(include)})"
    return item(name, ok, expected, found)


def flags_text(flags: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(flags.items())) or "(none)"


def flags_delta(expected: dict, found: dict) -> tuple[str, str]:
    """Only the flags that differ, as (expected, found) texts; all of them when equal."""
    if expected == found:
        return flags_text(expected), flags_text(found)
    keys = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
    fmt = lambda d: " ".join(f"{k}={d[k]}" if k in d else f"{k} unset" for k in keys)  # noqa: E731
    return fmt(expected), fmt(found)


def service_items(
    unit: str, state: str, enabled: bool, active: bool | None, is_enabled: bool | None
) -> list[Item]:
    """service_state / service_enabled of data vs systemd."""
    return [
        item(
            f"{unit} active",
            (state == "running") == bool(active),
            state,
            "running" if active else "stopped",
        ),
        item(
            f"{unit} enabled",
            enabled == bool(is_enabled),
            "enabled" if enabled else "disabled",
            "enabled" if is_enabled else "disabled",
        ),
    ]


def release_items(records: Releases, running: str | None, should_run: bool) -> list[Item]:
    """The recorded release, and whether the service runs it. A rolled-back host differs from
    its data: say from what it was rolled back. A release installed but never found healthy
    (a failed start, a converge interrupted before its restart) is drift too."""
    items = []
    if records.unreadable:
        return [
            item("release", False, "release records as servefleet writes them", records.unreadable)
        ]
    if records.rolled_back_from:
        current = records.current.describe if records.current else "no release"
        items.append(
            item(
                "release",
                False,
                f"the data's release ({records.rolled_back_from.short})",
                f"{current}: rolled back from {records.rolled_back_from.describe}",
            )
        )
    elif records.current:
        items.append(item("release", True, "recorded", records.current.describe))
    if records.current and should_run:
        items.append(
            item(
                "running release",
                running == records.current.id,
                f"{records.current.id} (the recorded release, started and healthy)",
                running or "none found healthy since it was installed",
            )
        )
    return items
