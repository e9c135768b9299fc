#!/usr/bin/env python3
"""Check a serving node's engine: unit state, /health, the KV-cache log lines, one chat, settle.

Pushed by servefleet to {servefleet_root}/bin/ and run there as root, after a (re)start and as
a rollout's gate, for both engines (vLLM, llama.cpp). Standard library only.

    health.py --url URL --model NAME [--unit UNIT] [--key-file FILE] [--timeout S] [--settle S]
              [--expect-tokens N --expect-concurrency X.XX --max-model-len L]
              [--kv-not-compared WHY] [--expect-stopped] [--log-file FILE]

1. --expect-stopped: the unit must be inactive (the data says it is stopped); nothing else.
2. Poll GET /health every second until 200, or fail as soon as the unit is failed, in
   auto-restart (a crash loop counts as failing) or has restarted since the check began, or
   after --timeout. A failure prints the unit's journal.
3. With --expect-*: read this start's journal (the unit's InvocationID; or --log-file) for
   vLLM's "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request: X.XXx"
   and fail on any difference from plan-kv's numbers, naming both.
4. POST /v1/chat/completions with one short message (Bearer key read from --key-file, never
   from the command line) and require a choice with a message.
5. --settle S: /health must stay 200 and the unit must neither restart nor stop for S seconds.
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


def read_key(path):
    """The API key: the first line of a plain key file (servefleet's etc/api-key)."""
    if not path:
        return None
    with open(path) as handle:
        return handle.readline().strip() or None


class Unit:
    """What systemd says of the unit (nothing when no unit is given, e.g. no systemd)."""

    def __init__(self, name):
        self.name = name

    def show(self):
        if not self.name:
            return {}
        out = subprocess.run(["systemctl", "show", "-p",
                              "ActiveState,SubState,NRestarts,InvocationID", self.name],
                             capture_output=True, text=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, invocation=None, lines=80):
        if not self.name:
            return []
        cmd = ["journalctl", "--no-pager", "-o", "cat"]
        if invocation:
            cmd += [f"_SYSTEMD_INVOCATION_ID={invocation}", "+", f"INVOCATION_ID={invocation}"]
        else:
            cmd += ["-u", self.name, "-n", str(lines)]
        out = subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()
        return out if invocation else out[-lines:]


def get_health(url):
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return resp.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def unit_trouble(unit, state, baseline_restarts):
    """Why the unit is not on its way to healthy, or None."""
    if not state:
        return None
    active, sub = state.get("ActiveState"), state.get("SubState")
    restarts = int(state.get("NRestarts") or 0)
    if active == "failed":
        return f"{unit.name} failed"
    if sub == "auto-restart" or restarts > baseline_restarts:
        return f"{unit.name} is crash-looping ({sub or active}, {restarts} automatic restarts)"
    if active in ("inactive", "deactivating"):
        return f"{unit.name} is {active}: it is not running"
    return None


def wait_healthy(url, unit, timeout, sleep=time.sleep, now=time.monotonic):
    deadline = now() + timeout
    baseline = int(unit.show().get("NRestarts") or 0)
    last = None
    while True:
        status, error = get_health(url)
        if status == 200:
            return None
        last = error or f"HTTP {status}"
        trouble = unit_trouble(unit, unit.show(), baseline)
        if trouble:
            return f"{trouble} before /health answered 200 (last answer: {last})"
        if now() >= deadline:
            return f"no healthy /health at {url} after {timeout} s (last answer: {last})"
        sleep(1)


def settle(url, unit, seconds, sleep=time.sleep, now=time.monotonic):
    """/health stays 200 and the unit keeps its invocation for `seconds`."""
    first = unit.show()
    deadline = now() + seconds
    while now() < deadline:
        sleep(1)
        status, error = get_health(url)
        state = unit.show()
        if state and state.get("InvocationID") != first.get("InvocationID"):
            return f"{unit.name} restarted during the {seconds} s settle period"
        trouble = unit_trouble(unit, state, int(first.get("NRestarts") or 0))
        if trouble:
            return f"{trouble} during the {seconds} s settle period"
        if status != 200:
            return f"/health answered {error or status} during the {seconds} s settle period"
    return None


MAX_ANSWER_BYTES = 1 << 20  # a 16-token answer is a few hundred bytes
MAX_JSON_DEPTH = 64


def _constant(name):
    raise ValueError(f"{name} is not a JSON number")


def read_answer(resp, deadline, now=time.monotonic):
    """The engine's answer: at most MAX_ANSWER_BYTES, all of it before the deadline (an endless
    or dripping answer from a hostile engine fails the check instead of holding it)."""
    chunks, size = [], 0
    while True:
        if now() > deadline:
            raise ValueError("the answer did not end in time")
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise ValueError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)


def parse_answer(data):
    """Strict, bounded JSON: no NaN/Infinity, at most MAX_JSON_DEPTH levels (checked before
    parsing: deep nesting would end the parser in a RecursionError)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                raise ValueError(f"the answer nests deeper than {MAX_JSON_DEPTH} levels")
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return json.loads(data, parse_constant=_constant)


def chat(url, model, key, timeout=300):
    body = json.dumps({"model": model, "max_tokens": 16, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = parse_answer(read_answer(resp, time.monotonic() + timeout))
    except urllib.error.HTTPError as exc:
        return None, f"chat completion: HTTP {exc.code} {exc.read(300)!r}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"chat completion: {exc}"
    try:
        message = answer["choices"][0]["message"]
        text = message.get("content") or message.get("reasoning_content") or ""
        if not isinstance(text, str):
            raise TypeError(type(text).__name__)
    except (KeyError, IndexError, TypeError, AttributeError):
        return None, f"chat completion: unexpected answer {json.dumps(answer)[:300]}"
    return text, None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--unit", default="")
    p.add_argument("--key-file")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--settle", type=int, default=0)
    p.add_argument("--expect-tokens", type=int)
    p.add_argument("--expect-concurrency")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-not-compared", help="say why the KV lines are not compared")
    p.add_argument("--expect-stopped", action="store_true")
    p.add_argument("--log-file", help="read the engine log from this file, not the journal")
    args = p.parse_args(argv)

    unit = Unit(args.unit)
    report = {"url": args.url, "unit": args.unit, "healthy": False}
    problems = []
    if args.expect_stopped:
        state = unit.show()
        report["active_state"] = state.get("ActiveState")
        if state.get("ActiveState") not in ("inactive", "failed", None):
            problems.append(f"{args.unit} is {state.get('ActiveState')}, the data says stopped")
    else:
        started = time.monotonic()
        waited = wait_healthy(args.url, unit, args.timeout)
        report["waited_s"] = round(time.monotonic() - started, 1)
        if waited:
            problems.append(waited)
        else:
            report["healthy"] = True
            invocation = unit.show().get("InvocationID")
            if args.log_file:
                with open(args.log_file) as handle:
                    lines = handle.read().splitlines()
            else:
                lines = unit.journal(invocation)
            seen = parse_engine_log(lines)
            report["engine_log"] = seen
            if args.kv_not_compared:
                report["kv"] = f"KV not compared: {args.kv_not_compared}"
            elif args.expect_tokens is not None:
                report["kv"] = "compared"
                report["expected"] = {"tokens": args.expect_tokens,
                                      "concurrency": args.expect_concurrency}
                problems += compare(seen, args.expect_tokens, args.expect_concurrency,
                                    args.max_model_len)
            text, error = chat(args.url, args.model, read_key(args.key_file))
            report["chat"] = text
            if error:
                problems.append(error)
            elif args.settle:
                unsettled = settle(args.url, unit, args.settle)
                report["settled_s"] = None if unsettled else args.settle
                if unsettled:
                    problems.append(unsettled)
    report["problems"] = problems
    if problems and args.unit:
        # The unit's last lines, across invocations: a crash loop's cause is in an earlier one.
        print(f"servefleet: the journal of {args.unit}:", file=sys.stderr)
        for line in unit.journal(lines=60):
            print(f"    {line}", file=sys.stderr)
    print(json.dumps(report))
    for problem in problems:
        print(f"servefleet: health: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
