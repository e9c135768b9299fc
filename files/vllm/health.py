#!/usr/bin/env python3
"""Check a freshly (re)started vLLM service: /health, its KV-cache log lines, one chat completion.

Pushed to nodes by servefleet (deploys/serve_bf16.py, health step) and run there as root, right
after the service was (re)started. Standard library only.

    health.py --url http://127.0.0.1:8000 --unit servefleet-vllm.service --model NAME
              [--timeout 1800] [--env-file /opt/servefleet/etc/vllm.env]
              [--expect-tokens N --expect-concurrency X.XX --max-model-len L]

1. Poll GET /health until 200 (every 5 s) or --timeout; fail early when the unit is failed.
2. Read this start's journal (the unit's current InvocationID) for vLLM's lines
   "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request: X.XXx" and,
   when --expect-* are given (plan-kv's numbers), fail on any difference, naming both.
3. POST /v1/chat/completions with one short message (Bearer VLLM_API_KEY from --env-file) and
   require a non-empty answer.
Prints one JSON line with what it saw; exit status 0 when all passed, 1 otherwise.
"""

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def parse_engine_log(lines):
    """{"tokens", "max_model_len", "concurrency"} from vLLM's startup lines (last one wins)."""
    seen = {}
    for line in lines:
        match = KV_TOKENS.search(line)
        if match:
            seen["tokens"] = int(match.group(1).replace(",", ""))
        match = CONCURRENCY.search(line)
        if match:
            seen["max_model_len"] = int(match.group(1).replace(",", ""))
            seen["concurrency"] = match.group(2)
    return seen


def compare(seen, tokens=None, concurrency=None, max_model_len=None):
    """Problems between the logged numbers and plan-kv's; [] when they agree."""
    problems = []
    if tokens is None and concurrency is None:
        return problems
    if "tokens" not in seen or "concurrency" not in seen:
        return ["the engine log of this start has no 'GPU KV cache size' / 'Maximum concurrency' "
                "line"]
    if tokens is not None and seen["tokens"] != tokens:
        problems.append(f"vLLM logged GPU KV cache size {seen['tokens']:,} tokens, plan-kv "
                        f"expected {tokens:,}")
    if concurrency is not None and seen["concurrency"] != concurrency:
        problems.append(f"vLLM logged maximum concurrency {seen['concurrency']}x, plan-kv "
                        f"expected {concurrency}x")
    if max_model_len is not None and seen.get("max_model_len") != max_model_len:
        problems.append(f"vLLM logged max model len {seen.get('max_model_len')}, the recipe "
                        f"asks {max_model_len}")
    return problems


def read_key(env_file):
    if not env_file:
        return None
    with open(env_file) as handle:
        for line in handle:
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1].strip()
    return None


def _systemctl_show(unit, prop):
    out = subprocess.run(["systemctl", "show", "-p", prop, "--value", unit],
                         capture_output=True, text=True)
    return out.stdout.strip()


def journal(unit):
    """This start's log lines: the unit's current invocation only."""
    invocation = _systemctl_show(unit, "InvocationID")
    cmd = ["journalctl", "--no-pager", "-o", "cat"]
    cmd += [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", unit, "-n", "2000"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()


def wait_healthy(url, unit, timeout, sleep=time.sleep, now=time.monotonic):
    deadline = now() + timeout
    last = None
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
                if resp.status == 200:
                    return None
                last = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if unit and _systemctl_show(unit, "ActiveState") == "failed":
            return f"{unit} failed while starting (last /health answer: {last})"
        if now() >= deadline:
            return f"no healthy /health at {url} after {timeout} s (last answer: {last})"
        sleep(5)


def chat(url, model, key, timeout=300):
    body = json.dumps({"model": model, "max_tokens": 16, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return None, f"chat completion: HTTP {exc.code} {exc.read()[:300]!r}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"chat completion: {exc}"
    try:
        text = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None, f"chat completion: unexpected answer {json.dumps(answer)[:300]}"
    if not text:
        return None, "chat completion: empty answer"
    return text, None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--unit", default="")
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--env-file")
    p.add_argument("--expect-tokens", type=int)
    p.add_argument("--expect-concurrency")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--log-file", help="read the engine log from this file, not the journal")
    args = p.parse_args(argv)

    report = {"url": args.url, "healthy": False}
    problems = []
    waited = wait_healthy(args.url, args.unit, args.timeout)
    if waited:
        problems.append(waited)
    else:
        report["healthy"] = True
        if args.log_file:
            with open(args.log_file) as handle:
                lines = handle.read().splitlines()
        else:
            lines = journal(args.unit)
        seen = parse_engine_log(lines)
        report["engine_log"] = seen
        report["expected"] = {"tokens": args.expect_tokens, "concurrency": args.expect_concurrency}
        problems += compare(seen, args.expect_tokens, args.expect_concurrency, args.max_model_len)
        text, error = chat(args.url, args.model, read_key(args.env_file))
        report["chat"] = text
        if error:
            problems.append(error)
    report["problems"] = problems
    print(json.dumps(report))
    for problem in problems:
        print(f"servefleet: vLLM health: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
