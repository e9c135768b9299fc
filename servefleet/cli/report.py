"""`servefleet report INVENTORY [-o FILE] [--limit ...] [--json]`: one self-contained HTML page
(cli/report_html.py) with the fleet's status, the last rollout's batches and verdicts, and each
node's release history with its decode and TTFT figures as charts. Reads only: nothing on a node
changes. Exit 0, or 3 when a host could not be read (the page says which, and why)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from servefleet.cli import json_report, package_version, report_html
from servefleet.core.errors import Exit, InputError
from servefleet.core.node_output import shown
from servefleet.core.rollout_record import RolloutView
from servefleet.verbs.report import NodeReport, report

DEFAULT_OUTPUT = "fleet-report.html"


def output_path(value: str) -> str:
    """-o FILE, taken from where the command was typed (the command then runs in the
    inventory's project)."""
    return str(Path(value).expanduser().absolute())


def register(sub) -> None:
    p = sub.add_parser("report", help="one HTML page: status, last rollout, release history charts")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append", help="host name, glob or group (repeatable)")
    p.add_argument(
        "-o",
        "--output",
        type=output_path,
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help=f"where to write the page (default {DEFAULT_OUTPUT})",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def writable(path: str) -> None:
    """Refuse (exit 2, before any host is reached) a FILE that cannot be written."""
    target = Path(path)
    if target.is_dir():
        raise InputError(f"-o {path}: is a directory; expected a file name")
    if not target.parent.is_dir():
        raise InputError(f"-o {path}: no directory {target.parent}")
    if not os.access(target.parent, os.W_OK):
        raise InputError(f"-o {path}: {target.parent} is not writable")


def write(path: str, text: str) -> None:
    """The page in place at once (a browser open on the old one never reads half of it)."""
    target = Path(path)
    fd, staged = tempfile.mkstemp(prefix=".servefleet-report.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(staged, 0o644)
        os.replace(staged, target)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    writable(args.output)
    nodes = report(args.inventory, args.limit)
    code = Exit.UNREACHABLE if not nodes or any(n.status.error for n in nodes) else Exit.OK
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        write(args.output, report_html.page(nodes, args.inventory, generated, package_version()))
    except OSError as exc:
        raise InputError(f"-o {args.output}: cannot be written ({exc.strerror})") from None
    if args.json:
        json_report.emit(to_json(nodes, code, args.output))
    else:
        print(summary(nodes, args.output))
    return int(code)


def summary(nodes: list[NodeReport], path: str) -> str:
    """What the page holds, in a few lines: where it is, the hosts, the last rollout."""
    unread = [n for n in nodes if n.status.error]
    healthy = sum(n.status.health == "200" for n in nodes)
    charts = sum(any(p.figures for p in n.history) for n in nodes)
    view = RolloutView.of({n.host: n.last_rollout for n in nodes if n.last_rollout})
    lines = [
        f"wrote {path}",
        f"  {len(nodes)} host(s): {healthy} healthy, {len(unread)} not read; "
        f"{charts} with bench figures charted",
        "  last rollout: "
        + (f"{shown(view.rollout_id)}, exit {view.exit_code}" if view else "none recorded"),
    ]
    lines += [f"  {n.host}: not read: {shown(str(n.status.error))}" for n in unread]
    return "\n".join(lines)


def to_json(nodes: list[NodeReport], code: int, path: str) -> dict:
    """--json (servefleet/cli/json_report.py): each node's status, release history (with its
    figures) and last rollout record by host; the summary counts the nodes read, not read,
    healthy and with figures; `output` is the page's path."""
    return json_report.document(
        {n.host: n.to_dict() for n in nodes},
        {
            "read": sum(not n.status.error for n in nodes),
            "not_read": sum(bool(n.status.error) for n in nodes),
            "healthy": sum(n.status.health == "200" for n in nodes),
            "with_figures": sum(any(p.figures for p in n.history) for n in nodes),
        },
        code,
        output=path,
    )
