"""`servefleet bench INVENTORY [--limit ...]`: TTFT and decode tok/s per node, median of runs."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from servefleet.cli.output import table
from servefleet.core.errors import Exit
from servefleet.verbs.bench import bench


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
    return None if value is None else format(value, fmt)


def render(results, runs: int, max_tokens: int) -> str:
    rows = [(r.host, _f(r.prompt_tokens, "d"), _f(r.median_ttft_s, ".3f"),
             _f(r.median_decode_tok_s, ".1f"), _f(r.roofline_tok_s, ".1f"),
             _f(r.roofline_ratio, ".2f"), "ok" if r.ok else r.error) for r in results]
    head = f"servefleet bench: median of {runs} runs, max_tokens {max_tokens}"
    body = table(("host", "prompt", "TTFT s", "tok/s", "roofline", "ratio", "status"), rows,
                 shrink=("host", "status"))
    failed = [r for r in results if not r.ok]
    tail = (f"\n{len(failed)} of {len(results)} nodes failed: "
            + "; ".join(f"{r.host}: {r.error}" for r in failed)) if failed else ""
    return f"{head}\n{body}{tail}"


def run(args) -> int:
    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    results = bench(args.inventory, args.limit, args.runs, args.prompt_tokens, args.max_tokens)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(render(results, args.runs, args.max_tokens))
    return int(Exit.OK if results and all(r.ok for r in results) else Exit.DIFFERS)
