"""Rebuild nodes from scratch: teardown (deploys/teardown.py), then converge the deploy, both
through the API. Acts only on explicitly selected, reachable hosts (at most max_hosts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from servefleet.core.errors import Exit
from servefleet.verbs import session as api

TEARDOWN = "deploys/teardown.py"


@dataclass
class RebuildResult:
    hosts: list[str]
    exit_code: int
    message: str = ""
    teardown: dict = field(default_factory=dict)  # name -> HostOutcome
    converge: dict = field(default_factory=dict)


def plan(
    inventory: str,
    limit: list[str],
    max_hosts: int,
    data: dict | None = None,
    deploy: str | None = None,
) -> RebuildResult:
    """Which hosts a rebuild would act on, or why it refuses (nothing changed). With `deploy`,
    the data is validated for it here, so bad data is refused before the teardown, not after."""
    with api.session(inventory, limit, data, deploy=deploy, check_for_changes=False) as sess:
        names = sorted(h.name for h in sess.targets)
        unreachable = dict(sess.unreachable)
    if not names:
        return RebuildResult(
            [], Exit.BAD_INPUT, f"--limit {' '.join(limit)} selects no host of {inventory}"
        )
    if len(names) > max_hosts:
        return RebuildResult(
            names,
            Exit.BAD_INPUT,
            f"--limit selects {len(names)} hosts ({', '.join(names)}), more than "
            f"--max-hosts {max_hosts}; name the hosts or raise --max-hosts",
        )
    if unreachable:
        return RebuildResult(names, Exit.UNREACHABLE, api.cannot_reach(unreachable))
    return RebuildResult(names, Exit.OK)


def rebuild(
    inventory: str,
    deploy: str,
    names: list[str],
    purge_models: bool,
    data: dict | None = None,
    say: Callable[[str], None] = lambda m: None,
    on_operation: Callable[[str], None] | None = None,
) -> RebuildResult:
    """Teardown, then the deploy; `say` hears each phase begin and end, `on_operation` each
    operation start (a full converge takes minutes: the operator sees where it is)."""
    result = RebuildResult(names, Exit.OK)
    started = time.monotonic()
    say(f"tearing down {', '.join(names)} ({TEARDOWN}{', models too' if purge_models else ''})")
    result.teardown = api.converge(
        inventory, TEARDOWN, names, {**(data or {}), "purge_models": purge_models}, on_operation
    )
    if not all(o.ok for o in result.teardown.values()):
        result.exit_code, result.message = Exit.DIFFERS, "teardown failed; not converging"
        return result
    say(
        f"teardown done in {time.monotonic() - started:.0f} s; converging {deploy} "
        f"(a first converge: downloads, builds, the health check)"
    )
    started = time.monotonic()
    result.converge = api.converge(inventory, deploy, names, data, on_operation)
    say(f"converge finished in {time.monotonic() - started:.0f} s")
    if not all(o.ok for o in result.converge.values()):
        result.exit_code = Exit.DIFFERS
        result.message = "converge failed on " + ", ".join(
            f"{n} ({o.error})" for n, o in result.converge.items() if not o.ok
        )
    return result
