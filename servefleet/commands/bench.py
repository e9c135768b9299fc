"""`servefleet bench INVENTORY [--limit ...]`: TTFT and decode tok/s per node, median of runs."""

import json
import logging
from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from servefleet.bench import bench


def register(sub) -> None:
    p = sub.add_parser("bench", help="streaming chat benchmark on each serving node")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append")
    p.add_argument("--runs", type=int, default=5, help="measured runs after one warm-up")
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _f(value, fmt):
    return "-" if value is None else format(value, fmt)


def print_results(results, console: Console, runs: int, max_tokens: int) -> None:
    table = Table(title=f"servefleet bench (median of {runs} runs, max_tokens {max_tokens})")
    for col in ("host", "prompt tokens", "TTFT s", "decode tok/s", "roofline tok/s",
                "of roofline", "status"):
        table.add_column(col, justify="right" if col != "host" else "left")
    for r in results:
        table.add_row(r.host, _f(r.prompt_tokens, "d"), _f(r.median_ttft_s, ".3f"),
                      _f(r.median_decode_tok_s, ".1f"), _f(r.roofline_tok_s, ".1f"),
                      _f(r.roofline_ratio, ".2f"),
                      "[green]ok[/]" if r.ok else f"[red]{r.error}[/]")
    console.print(table)
    failed = [r for r in results if not r.ok]
    if failed:
        console.print(f"{len(failed)} of {len(results)} nodes failed: "
                      + "; ".join(f"{r.host}: {r.error}" for r in failed))


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    results = bench(args.inventory, args.limit, args.runs, args.prompt_tokens, args.max_tokens)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print_results(results, Console(), args.runs, args.max_tokens)
    return 0 if results and all(r.ok for r in results) else 1
