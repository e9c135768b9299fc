#!/usr/bin/env python3
"""Streaming chat-completion benchmark, run ON the serving node (stdlib only; any python3).

The field method: stream_options.include_usage, temperature 0, ignore_eos, max_tokens 256, a
random prefix per request to defeat prefix caching, a prompt of about --prompt-tokens tokens;
TTFT = first content chunk - request sent; decode tok/s = (completion_tokens - 1) /
(t_end - t_first_token). Warm-up requests first, then --runs measured ones. Prints one JSON line.

With --cgroup (the engine unit's cgroup), each figure also comes without the time the engine
waited for a CPU that other work on the node held (the `full` stall of its cpu.pressure, PSI):
`own_ttft_s` and `own_decode_tok_s`. The performance gate compares those where both
measurements have them: a node busy with a compile slows the engine, not the release.

Every answer is read through bin/engine_client.py (beside this script on the node): the whole
run has one deadline (--timeout: every connect, header and body byte of every request before
it), answers and stream lines are bounded in bytes, JSON in depth, and the engine's usage must
be integers in range (completion_tokens at most max_tokens). An answer the reader refuses ends
the bench with one line on stderr and exit status 1. A figure the engine's answer leaves
unmeasurable (no usage, no content chunk) is null, and `unmeasured` says why: a null figure is
never a pass (servefleet.core.perf).
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import uuid


def _engine_client():
    """bin/engine_client.py, beside this script on the node (python -I leaves the script's own
    directory off sys.path; bin/ is root's), loaded by its file name; in the source tree
    (this file is files/bench/stream_bench.py) files/engine_client/engine_client.py."""
    here = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(here, "engine_client.py")
    if not os.path.isfile(path) and __file__.endswith(".py"):
        path = os.path.join(os.path.dirname(here), "engine_client", "engine_client.py")
    spec = importlib.util.spec_from_file_location("engine_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine = _engine_client()

TOKENIZE_S = 30.0  # the prompt sizing's share of the deadline, at most
TOKENS_MAX = 10_000_000
STREAM_BYTES_PER_TOKEN = 16 << 10  # an event stream's bound: this much per token asked, ...
STREAM_BYTES_MIN = 16 << 20  # ... and at least this much


def tokens_per_unit(url, headers, unit, deadline):
    """(tokens one repeat unit costs by the server's tokenizer (llama.cpp and vLLM), None), or
    (1.0, why) when it cannot say."""
    what = "POST /tokenize"
    try:
        answer = engine.request(
            url,
            "POST",
            "/tokenize",
            deadline.sooner(TOKENIZE_S),
            {"content": unit * 50, "prompt": unit * 50},
            headers,
            what=what,
        )
        try:
            doc = answer.expect(200).json()
        finally:
            answer.close()
        tokens = engine.items(engine.field(doc, "tokens", what), f"{what}: 'tokens'")
        if not 1 <= len(tokens) <= 5000:
            raise engine.EngineError(f"{what}: {len(tokens)} tokens for 50 repeats")
    except engine.EngineError as exc:
        return 1.0, str(exc)
    return len(tokens) / 50, None


class CpuWait:
    """The time the engine's cgroup waited for a CPU it did not get: the `full` line of its
    cpu.pressure (PSI), the microseconds during which every runnable task of the engine was
    waiting, none running. Work of other processes on the node (a compile, a neighbour's job)
    shows there; the engine's own threads competing with each other do not (one of them runs).
    No file (no PSI in the kernel, another cgroup layout): None, and the figures stay raw."""

    def __init__(self, cgroup):
        self.path = os.path.join(cgroup, "cpu.pressure") if cgroup else None

    def total(self):
        if not self.path:
            return None
        try:
            with open(self.path, "rb") as handle:
                text = handle.read(4096).decode("ascii", "replace")
        except OSError:
            return None
        for line in text.splitlines():
            words = line.split()
            if words and words[0] == "full":
                for word in words[1:]:
                    key, _, value = word.partition("=")
                    if key == "total" and value.isdigit():
                        return int(value) / 1e6
        return None


def waited(before, after):
    return None if before is None or after is None else max(0.0, after - before)


def one_request(url, headers, model, prompt, max_tokens, deadline, cpu=None):
    """One streamed request: its figures; a figure the answer leaves unmeasurable is None and
    `unmeasured` says why. EngineError for an answer the reader refuses. With `cpu` (CpuWait),
    also the engine's CPU waits during the prefill and the decode, and the figures without
    them (`own_`)."""
    cpu = cpu or CpuWait(None)
    w_first = None
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "ignore_eos": True,
        "max_tokens": max_tokens,
    }
    if model:
        body["model"] = model
    what = "the chat completion stream"
    w_send = cpu.total()
    t_send = time.monotonic()
    answer = engine.request(
        url,
        "POST",
        "/v1/chat/completions",
        deadline,
        body,
        headers,
        what=what,
        max_bytes=max(STREAM_BYTES_MIN, max_tokens * STREAM_BYTES_PER_TOKEN),
    )
    t_first = None
    usage = None
    done = False
    try:
        answer.expect(200)
        for line in answer.lines():
            if done and line.strip():
                raise engine.EngineError(f"{what}: data after 'data: [DONE]'")
            if not line.startswith(b"data:"):
                continue  # an SSE comment, event or id line, or the blank line between events
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            chunk = engine.obj(engine.loads(data, what), f"{what}: a chunk")
            if chunk.get("usage") is not None:
                usage = engine.obj(chunk["usage"], f"{what}: 'usage'")
            choices = chunk.get("choices")
            for choice in engine.items([] if choices is None else choices, f"{what}: 'choices'"):
                delta = engine.obj(choice, f"{what}: a choice").get("delta")
                delta = engine.obj({} if delta is None else delta, f"{what}: 'delta'")
                content = engine.text(delta.get("content"), f"{what}: 'content'", optional=True)
                if t_first is None and content:
                    t_first = time.monotonic()
                    w_first = cpu.total()
    finally:
        answer.close()
    t_end = time.monotonic()
    w_end = cpu.total()
    unmeasured = []
    completion = prompt_tokens = None
    if usage is None:
        unmeasured.append("decode: the stream sent no usage (completion_tokens)")
    else:
        completion = engine.count(
            engine.field(usage, "completion_tokens", f"{what}: 'usage'"),
            f"{what}: 'completion_tokens'",
            0,
            max_tokens,
        )
        if usage.get("prompt_tokens") is not None:
            prompt_tokens = engine.count(
                usage["prompt_tokens"], f"{what}: 'prompt_tokens'", 0, TOKENS_MAX
            )
    if t_first is None:
        unmeasured.append("TTFT: the stream sent no content")
    decode = own_decode = wait_prefill = wait_decode = None
    if t_first is not None:
        wait_prefill, wait_decode = waited(w_send, w_first), waited(w_first, w_end)
    if completion is not None and t_first is not None:
        if completion > 1 and t_end > t_first:
            decode = (completion - 1) / (t_end - t_first)
            if wait_decode is not None and t_end - t_first - wait_decode > 0:
                own_decode = (completion - 1) / (t_end - t_first - wait_decode)
        else:
            unmeasured.append(f"decode: {completion} completion tokens")
    ttft = None if t_first is None else t_first - t_send
    own_ttft = None if ttft is None or wait_prefill is None else max(ttft - wait_prefill, 1e-6)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "ttft_s": ttft,
        "decode_tok_s": decode,
        "cpu_wait_s": None if wait_prefill is None else [wait_prefill, wait_decode],
        "own_ttft_s": own_ttft,
        "own_decode_tok_s": own_decode,
        "unmeasured": unmeasured,
    }


def median(values):
    """The median of the figures, or None when any run left its figure unmeasured."""
    return None if not values or any(v is None for v in values) else statistics.median(values)


def read_key(path):
    """The node's key file (etc/api-key, root 0600): its first line; a node without an API key
    has none."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as handle:
        return handle.readline(4096).strip() or None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model")
    ap.add_argument("--api-key-file")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--cgroup",
        help="the engine unit's cgroup directory: its CPU waits (PSI) are measured too",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds for the whole bench, every request together",
    )
    args = ap.parse_args(argv)
    if (
        args.runs < 1
        or args.max_tokens < 1
        or args.prompt_tokens < 1
        or args.warmup < 0
        or not 0 < args.timeout < 1e7
    ):
        ap.error("--runs, --max-tokens, --prompt-tokens and --timeout must be positive")
    deadline = engine.Deadline(args.timeout)
    key = read_key(args.api_key_file)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    unit = " hello"
    runs = []
    cpu = CpuWait(args.cgroup)
    try:
        per_unit, sizing = tokens_per_unit(args.url, headers, unit, deadline)
        repeats = max(1, min(int(args.prompt_tokens / max(per_unit, 0.01)), TOKENS_MAX))
        for i in range(args.warmup + args.runs):
            prompt = f"{uuid.uuid4()} " + unit * repeats  # random prefix: no prefix-cache hits
            result = one_request(
                args.url, headers, args.model, prompt, args.max_tokens, deadline, cpu
            )
            if i >= args.warmup:
                runs.append(result)
    except engine.EngineError as exc:
        print(f"servefleet: bench: {exc}", file=sys.stderr)
        return 1
    unmeasured = sorted({why for r in runs for why in r["unmeasured"]})
    print(
        json.dumps(
            {
                "runs": runs,
                "median_ttft_s": median([r["ttft_s"] for r in runs]),
                "median_decode_tok_s": median([r["decode_tok_s"] for r in runs]),
                # Without the engine's CPU waits (PSI; None where the node cannot tell).
                "median_own_ttft_s": median([r["own_ttft_s"] for r in runs]),
                "median_own_decode_tok_s": median([r["own_decode_tok_s"] for r in runs]),
                "prompt_tokens": runs[0]["prompt_tokens"],
                "max_tokens": args.max_tokens,
                "unmeasured": unmeasured,
                "prompt_sizing": sizing or "the server's tokenizer",
            },
            allow_nan=False,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
