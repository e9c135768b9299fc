"""--json: one shape for every fleet verb (bench, drift, rebuild, report, rollback, rollout,
status), and for a refusal of any command that takes --json (docs/day2.md, "Machine-readable
reports"):

    {"hosts": {NAME: {...}}, "summary": {"hosts": N, ...}, "exit_code": N, "error": null, ...}

`hosts` maps each host's name to what the verb found on it; `summary` counts the hosts, then
the hosts in each state the verb knows; `exit_code` is the code the command exits with; `error`
is null, or the one-line reason of a refusal (bad input, an unreachable host, a cancelled
question), which then has no hosts. A verb may add keys of its own beside these four.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping


def document(
    hosts: Mapping[str, object],
    summary: Mapping[str, int],
    exit_code: int,
    error: str | None = None,
    **extra: object,
) -> dict:
    return {
        "hosts": dict(hosts),
        "summary": {"hosts": len(hosts), **{k: v for k, v in summary.items() if k != "hosts"}},
        "exit_code": int(exit_code),
        "error": error,
        **extra,
    }


def refusal(message: str, exit_code: int, **extra: object) -> dict:
    """A command refused before it reached any host: the message, the code, no hosts."""
    return document({}, {}, exit_code, error=message, **extra)


def counts(states: Iterable[str], known: Iterable[str]) -> dict[str, int]:
    """How many hosts are in each of the `known` states ("rolled back" counted as rolled_back),
    every state listed, zero or not, so that a consumer can read any of them."""
    seen = list(states)
    return {k.replace(" ", "_"): seen.count(k) for k in known}


def emit(doc: Mapping) -> None:
    print(json.dumps(doc, indent=2))
