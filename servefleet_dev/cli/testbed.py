"""`servefleet testbed up|add|rm|stop|start|status|ssh|fleet|down`: the local fleet of real Debian
hosts."""

import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from servefleet.fleet.registry import parse_role
from servefleet_dev.testbed import fleetfile, hosts, lifecycle, material
from servefleet_dev.testbed.root import EXIT_NEEDS_ROOT, needs_root
from servefleet_dev.testbed.state import load_state


def register(sub) -> None:
    p = sub.add_parser("testbed", help="local testbed of systemd-nspawn hosts")
    tsub = p.add_subparsers(dest="action", required=True)
    up = tsub.add_parser("up", help="start the testbed (network, hub, hosts)")
    up.add_argument(
        "--hosts",
        default=",".join(lifecycle.DEFAULT_HOSTS),
        help="comma-separated names; the prefix is the role (spark-1, rtx4090-1, depot-1), an "
        "optional @RELEASE-ARCH suffix the Debian release (bookworm, the default, or trixie) and "
        "architecture (amd64, the default, or arm64): spark-2@trixie, spark-3@bookworm-arm64",
    )
    add = tsub.add_parser("add", help="add a fresh host next to the running ones")
    add.add_argument("name", help="as in `up --hosts`: spark-9, spark-9@trixie-arm64")
    rm = tsub.add_parser("rm", help="stop and delete one host")
    rm.add_argument("name")
    stop = tsub.add_parser("stop", help="power one host off, keeping its disk (a node down)")
    stop.add_argument("name")
    start = tsub.add_parser("start", help="boot a host that `stop` powered off")
    start.add_argument("name")
    st = tsub.add_parser(
        "status", help="table of hosts: name, role, release, arch, address, systemd state"
    )
    st.add_argument("--json", action="store_true")
    ssh = tsub.add_parser("ssh", help="ssh into a host: ssh NAME [-- CMD...]")
    ssh.add_argument("name")
    ssh.add_argument(
        "--user", default="root", help="root (default) or fleetadmin, servefleet's login"
    )
    ssh.add_argument("cmd", nargs="*")
    fleet = tsub.add_parser(
        "fleet",
        help="write the testbed's hosts as fleet.yml entries (README's first-node steps, "
        "rehearsed: docs/testbed.md)",
    )
    fleet.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write FILE (a new one, or one this command wrote) instead of printing; then "
        "export SERVEFLEET_FLEET=FILE",
    )
    tsub.add_parser("down", help="stop everything and leave nothing behind")
    p.set_defaults(func=run)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def print_status(rows: list[dict], console: Console | None = None) -> None:
    table = Table(title="servefleet testbed")
    for col in ("name", "role", "release", "arch", "address", "systemd"):
        table.add_column(col)
    for row in rows:
        style = "green" if row["systemd"] == "running" else "red"
        table.add_row(
            row["name"],
            row["role"],
            row["release"],
            row["arch"],
            row["address"],
            f"[{style}]{row['systemd']}[/]",
        )
    (console or Console()).print(table)


def write_fleet(output: str | None) -> None:
    """The fleet.yml entries of the running testbed, once the test material its hosts' recipes
    need is ready (the wheels, the stand-in, the tiny models: cached, cheap once done)."""
    state = load_state()
    if not state.hosts or "hub" not in state.services:
        raise ValueError("no testbed is up; expected `servefleet testbed up` first")
    served = {e.name for e in (parse_role(r.role)[1] for r in state.hosts.values()) if e}
    material.prepare(spark="vllm" in served, rtx4090="llamacpp" in served, log=_log)
    path = Path(output) if output else None
    text = fleetfile.render(state, path)
    if path is None:
        sys.stdout.write(text)
        return
    fleetfile.write(path, text)
    _log(f"wrote {path}: {len(state.hosts)} hosts; now: export SERVEFLEET_FLEET={path.resolve()}")


def run(args) -> int:
    refused = needs_root(f"servefleet testbed {args.action}")
    if refused:  # not an empty table, nor a failure half-way that advises the wrong fix
        print(refused, file=sys.stderr)
        return EXIT_NEEDS_ROOT
    try:
        if args.action == "up":
            names = [n.strip() for n in args.hosts.split(",") if n.strip()]
            lifecycle.up(names, log=_log)
            print_status(lifecycle.status())
        elif args.action == "add":
            lifecycle.add(args.name, log=_log)
            print_status(lifecycle.status())
        elif args.action == "rm":
            lifecycle.rm(args.name, log=_log)
        elif args.action == "stop":
            lifecycle.stop(args.name, log=_log)
        elif args.action == "start":
            lifecycle.start(args.name, log=_log)
            print_status(lifecycle.status())
        elif args.action == "status":
            rows = lifecycle.status()
            if args.json:
                print(json.dumps({"hosts": rows, "services": load_state().services}, indent=2))
            else:
                print_status(rows)
        elif args.action == "ssh":
            rec = load_state().hosts.get(args.name)
            if rec is None:
                raise ValueError(f"no testbed host named {args.name}")
            argv = [*hosts.ssh_args(rec, args.user), *args.cmd]
            os.execvp(argv[0], argv)
        elif args.action == "fleet":
            write_fleet(args.output)
        elif args.action == "down":
            lifecycle.down(log=_log)
    except (ValueError, RuntimeError, TimeoutError) as exc:
        print(f"servefleet testbed {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0
