"""`servefleet status INVENTORY [--limit ...] [--json]`: role, engine, model, service per node."""

import json
import logging

from rich.console import Console
from rich.table import Table

from servefleet.status import status


def register(sub) -> None:
    p = sub.add_parser("status", help="what each node runs: engine, model, service, health")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def print_status(nodes, console: Console) -> None:
    table = Table(title="servefleet status")
    for col in ("host", "role", "engine", "model", "revision", "service", "/health", "port",
                "memory GiB", "VRAM GiB"):
        table.add_column(col, overflow="fold")
    for n in nodes:
        if n.error:
            table.add_row(n.host, n.role or "-", f"[red]{n.error}[/]", *["-"] * 7)
            continue
        health = n.health or "-"
        table.add_row(n.host, n.role or "-", n.engine or "-", n.model or "-", n.revision or "-",
                      n.service or "-",
                      f"[green]{health}[/]" if health == "200" else health,
                      str(n.port or "-"), f"{n.memory_used_gib}/{n.memory_total_gib}",
                      "-" if n.vram_used_gib is None else str(n.vram_used_gib))
    console.print(table)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    nodes = status(args.inventory, args.limit)
    if args.json:
        print(json.dumps([n.to_dict() for n in nodes], indent=2))
    else:
        print_status(nodes, Console())
    return 0 if nodes and not any(n.error for n in nodes) else 1
