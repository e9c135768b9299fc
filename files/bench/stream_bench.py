#!/usr/bin/env python3
"""Streaming chat-completion benchmark, run ON the serving node (stdlib only; any python3).

The field method: stream_options.include_usage, temperature 0, ignore_eos, max_tokens 256, a
random prefix per request to defeat prefix caching, a prompt of about --prompt-tokens tokens;
TTFT = first content chunk - request sent; decode tok/s = (completion_tokens - 1) /
(t_end - t_first_token). Warm-up requests first, then --runs measured ones. Prints one JSON line.
"""

import argparse
import http.client
import json
import os
import statistics
import time
import urllib.parse
import uuid


def post(url, path, body, headers, stream=False):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"POST {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
    return resp if stream else json.loads(resp.read())


def tokens_per_unit(url, headers, unit):
    """Ask the server's tokenizer how many tokens one repeat unit costs (llama.cpp and vLLM)."""
    try:
        out = post(url, "/tokenize", {"content": unit * 50, "prompt": unit * 50}, headers)
        return max(len(out.get("tokens", [])) / 50, 0.01)
    except (SystemExit, OSError, ValueError):
        return 1.0


def one_request(url, headers, model, prompt, max_tokens):
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0, "ignore_eos": True,
            "max_tokens": max_tokens}
    if model:
        body["model"] = model
    t_send = time.monotonic()
    resp = post(url, "/v1/chat/completions", body, headers, stream=True)
    t_first = None
    usage = {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if t_first is None and (choice.get("delta") or {}).get("content"):
                t_first = time.monotonic()
    t_end = time.monotonic()
    completion = usage.get("completion_tokens", 0)
    return {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": completion,
            "ttft_s": (t_first or t_end) - t_send,
            "decode_tok_s": (completion - 1) / (t_end - t_first) if t_first and completion > 1
            and t_end > t_first else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model")
    ap.add_argument("--api-key-file")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    headers = {}
    # The node's key file (etc/api-key, root 0600); a node without an API key has none.
    if args.api_key_file and os.path.exists(args.api_key_file):
        headers["Authorization"] = "Bearer " + open(args.api_key_file).read().strip()
    unit = " hello"
    repeats = max(1, int(args.prompt_tokens / tokens_per_unit(args.url, headers, unit)))
    runs = []
    for i in range(args.warmup + args.runs):
        prompt = f"{uuid.uuid4()} " + unit * repeats  # random prefix: no prefix-cache hits
        result = one_request(args.url, headers, args.model, prompt, args.max_tokens)
        if i >= args.warmup:
            runs.append(result)
    decode = [r["decode_tok_s"] for r in runs if r["decode_tok_s"]]
    print(json.dumps({
        "runs": runs,
        "median_ttft_s": statistics.median(r["ttft_s"] for r in runs),
        "median_decode_tok_s": statistics.median(decode) if decode else None,
        "prompt_tokens": runs[0]["prompt_tokens"], "max_tokens": args.max_tokens,
    }))


if __name__ == "__main__":
    main()
