"""`servefleet bench INVENTORY [--limit ...] [--compare]`: TTFT and decode tok/s per node, median
of runs; --compare: against the figures each node's previous release recorded (exit 1 when a node
failed or is slower than the data's performance-gate thresholds allow)."""

from __future__ import annotations

import logging
import textwrap
from dataclasses import asdict

from rich.console import Console

from servefleet.cli import json_report
from servefleet.cli.output import table
from servefleet.core.errors import Exit
from servefleet.verbs.bench import bench, compare


def register(sub) -> None:
    p = sub.add_parser("bench", help="streaming chat benchmark on each serving node")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append")
    p.add_argument(
        "--runs",
        type=int,
        help="measured runs after one warm-up (default 5; --compare: the data's perf_gate_runs)",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        help="default 2048; --compare: the data's perf_gate_prompt_tokens",
    )
    p.add_argument(
        "--max-tokens", type=int, help="default 256; --compare: the data's perf_gate_max_tokens"
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="each node now against its previous release's recorded figures",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _f(value, fmt):
    return None if value is None else format(value, fmt)


def render(results, runs: int, max_tokens: int) -> str:
    rows = [
        (
            r.host,
            _f(r.prompt_tokens, "d"),
            _f(r.median_ttft_s, ".3f"),
            _f(r.median_decode_tok_s, ".1f"),
            _f(r.roofline_tok_s, ".1f"),
            # Where no roofline means anything (a testbed host), the row says so, not a ratio.
            "n/a (below)" if r.ok and r.roofline_note else _f(r.roofline_ratio, ".2f"),
            _status(r),
        )
        for r in results
    ]
    head = f"servefleet bench: median of {runs} runs, max_tokens {max_tokens}"
    body = table(
        ("host", "prompt", "TTFT s", "tok/s", "roofline", "ratio", "status"),
        rows,
        shrink=("host", "status"),
    )
    notes = "".join(
        "\n"
        + textwrap.fill(
            f"{r.host}: no roofline ratio: {r.roofline_note}", 80, subsequent_indent="  "
        )
        for r in results
        if r.ok and r.roofline_note
    )
    return f"{head}\n{body}{notes}{_reasons(results)}"


def _status(r) -> str:
    if r.skipped:
        return "skipped (below)"
    return "ok" if r.ok else "not reached (below)" if r.unreachable else "failed (below)"


def _reasons(results) -> str:
    """Each skipped or failed node's whole reason, on lines of its own (wrapped, never cut)."""
    said = [r for r in results if not r.ok]
    failed = [r for r in said if not r.skipped]
    lines = [
        textwrap.fill(
            f"{r.host}: skipped: {r.skipped}"
            if r.skipped
            else f"{r.host}: {'not reached' if r.unreachable else 'failed'}: {r.error}",
            80,
            subsequent_indent="  ",
        )
        for r in said
    ]
    benched = len(results) - (len(said) - len(failed))
    if results and not benched:
        lines.append("no serving node selected: nothing was benched")
    return "".join(f"\n{line}" for line in lines) + (
        f"\n{len(failed)} of {benched} nodes failed" if failed else ""
    )


def exit_code(results, slower: bool = False) -> Exit:
    """3 when a node could not be reached, else 1 when one failed (or, --compare, is slower),
    or when no node was benched at all; a skipped host (no serving engine) is no failure."""
    benched = [r for r in results if not r.skipped]
    if any(r.unreachable for r in benched):
        return Exit.UNREACHABLE
    return Exit.DIFFERS if slower or not benched or not all(r.ok for r in benched) else Exit.OK


def to_json(results, code: int, compared: bool = False) -> dict:
    """--json (servefleet/cli/json_report.py): each node's figures by host; the summary counts
    the nodes benched, failed, not reached, skipped (no serving engine) and, --compare, slower."""
    summary = {
        "ok": sum(r.ok for r in results),
        "failed": sum(not r.ok and not r.unreachable and not r.skipped for r in results),
        "unreachable": sum(r.unreachable for r in results),
        "skipped": sum(bool(r.skipped) for r in results),
    }
    if compared:
        summary["slower"] = sum(r.slower for r in results)
    return json_report.document({r.host: asdict(r) for r in results}, summary, code)


def _fig(doc, key, fmt):
    return None if not doc or doc.get(key) is None else format(doc[key], fmt)


def render_compare(results) -> str:
    rows = [
        (
            r.host,
            r.release,
            _fig(r.now, "decode_tok_s", ".1f"),
            _fig(r.now, "ttft_s", ".3f"),
            r.previous_release,
            _fig(r.previous, "decode_tok_s", ".1f"),
            _fig(r.previous, "ttft_s", ".3f"),
            ("slower" if r.slower else "ok") if r.ok else _status(r),
        )
        for r in results
    ]
    body = table(
        ("host", "release", "tok/s", "TTFT s", "previous", "then tok/s", "then TTFT", "status"),
        rows,
        shrink=("release", "previous", "status"),
    )
    lines = "".join(f"\n{r.host}: {'; '.join(r.lines)}" for r in results if r.ok and r.lines)
    return (
        f"servefleet bench --compare: now against the previous release's figures\n{body}"
        f"{lines}{_reasons(results)}"
    )


def _progress(args, what: str):
    """A spinner on stderr while the nodes are benched (a bench takes minutes on a big model);
    rich shows nothing when stderr is not a terminal, nor under --json."""
    return Console(stderr=True, quiet=args.json, highlight=False).status(what)


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    if args.compare:
        with _progress(args, "benching each node against its previous release"):
            compared = compare(
                args.inventory, args.limit, args.runs, args.prompt_tokens, args.max_tokens
            )
        code = exit_code(compared, slower=any(r.slower for r in compared))
        if args.json:
            json_report.emit(to_json(compared, code, compared=True))
        else:
            print(render_compare(compared))
        return int(code)
    runs, prompt = args.runs or 5, args.prompt_tokens or 2048
    max_tokens = args.max_tokens or 256
    with _progress(args, f"benching each node: {runs} runs of {max_tokens} tokens"):
        results = bench(args.inventory, args.limit, runs, prompt, max_tokens)
    code = exit_code(results)
    if args.json:
        json_report.emit(to_json(results, code))
    else:
        print(render(results, runs, max_tokens))
    return int(code)
