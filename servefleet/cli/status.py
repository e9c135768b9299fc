"""`servefleet status INVENTORY [--limit ...] [--wide] [--json]`: role, engine, model, service,
health and release per node; one line per host in 80 columns."""

from __future__ import annotations

import logging

from servefleet.cli import json_report
from servefleet.cli.output import table, width, wrap
from servefleet.core.errors import Exit
from servefleet.core.perf import short as perf_short
from servefleet.verbs.status import status


def register(sub) -> None:
    p = sub.add_parser("status", help="what each node runs: engine, model, service, health")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append")
    p.add_argument("--wide", action="store_true", help="every detail, whatever the width")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def model_name(repo: str | None) -> str | None:
    return repo.rsplit("/", 1)[-1] if repo else repo


def render(nodes, wide: bool = False) -> str:
    headers: tuple[str, ...]
    rows: list[tuple[object, ...]]
    if wide:
        headers = (
            "host",
            "role",
            "engine",
            "model",
            "revision",
            "service",
            "enabled",
            "/health",
            "port",
            "memory GiB",
            "VRAM GiB",
            "release",
            "previous",
            "release perf",
            "previous perf",
            "error",
        )
        rows = [
            (
                n.host,
                n.role,
                n.engine_detail,
                n.model,
                n.revision,
                n.service,
                n.enabled,
                n.health,
                n.port,
                None if n.memory_total_gib is None else f"{n.memory_used_gib}/{n.memory_total_gib}",
                n.vram_used_gib,
                n.release
                + (f" (rolled back from {n.rolled_back_from})" if n.rolled_back_from else "")
                if n.release
                else None,
                n.previous_release,
                perf_short(n.release_perf),
                perf_short(n.previous_release_perf),
                n.error,
            )
            for n in nodes
        ]
        return table(headers, rows, max_width=10**6)
    # 80 columns: the engine and its version are never cut (the model's name is, first); the
    # previous release, the revision and the figures are --wide's.
    headers = ("host", "role", "engine", "model", "service", "health")
    rows = []
    for n in nodes:
        if n.error:  # the reason, whole, goes under the table
            rows.append((n.host, n.role, "not read (below)", None, None, None))
            continue
        rows.append((n.host, n.role, n.engine, model_name(n.model), n.service, n.health))
    lines = [table(headers, rows, shrink=("model", "role"))]
    for n in nodes:
        if n.error:
            lines += wrap(f"{n.host}: not read: {n.error}", width(), "", "  ")
    return "\n".join(lines)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    nodes = status(args.inventory, args.limit)
    code = Exit.UNREACHABLE if not nodes or any(n.error for n in nodes) else Exit.OK
    if args.json:
        json_report.emit(to_json(nodes, code))
    else:
        print(render(nodes, wide=args.wide))
    return int(code)


def to_json(nodes, code: int) -> dict:
    """--json (servefleet/cli/json_report.py): each node's status by host; the summary counts
    the nodes read, those not read (the reason in the node's `error`) and those whose /health
    answered 200."""
    return json_report.document(
        {n.host: n.to_dict() for n in nodes},
        {
            "read": sum(not n.error for n in nodes),
            "not_read": sum(bool(n.error) for n in nodes),
            "healthy": sum(n.health == "200" for n in nodes),
        },
        code,
    )
