#!/usr/bin/env python3
"""Check a serving node's engine: unit state, /health, the KV-cache log lines, one chat, settle.

Pushed by servefleet to {servefleet_root}/bin/ and run there as root, after a (re)start and as
a rollout's gate, for both engines (vLLM, llama.cpp). Standard library only, and bin/'s
engine_client.py: every answer of the engine is read through it (one deadline for connect,
headers and body; bounded bytes and JSON depth; strict types; redirects never followed).

    health.py --url URL --model NAME [--unit UNIT] [--key-file FILE] [--timeout S] [--settle S]
              [--expect-tokens N --expect-concurrency X.XX --max-model-len L]
              [--kv-not-compared WHY] [--expect-stopped] [--log-file FILE]

1. --expect-stopped: the unit must be inactive (the data says it is stopped); nothing else.
2. Poll GET /health every second until 200 (each probe within 5 s), or fail as soon as the
   unit is failed, in auto-restart (a crash loop counts as failing) or has restarted since the
   check began, or at the deadline: --timeout seconds after the check began, for steps 2 to 4
   together. A failure prints the unit's journal.
3. With --expect-*: read this start's journal (the unit's InvocationID; or --log-file) for
   vLLM's "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request: X.XXx"
   and fail on any difference from plan-kv's numbers, naming both.
4. POST /v1/chat/completions with one short message (Bearer key read from --key-file, never
   from the command line) and require a choice with a message, before the same deadline.
5. --settle S: /health must stay 200 and the unit must neither restart nor stop for S seconds
   (each probe within 5 s). The whole check ends within --timeout + --settle + 5 s.
Prints one JSON line with what it saw; exit status 0 when all passed, 1 otherwise (an answer
the reader refuses is one line on stderr, like any other problem).
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time


def _engine_client():
    """bin/engine_client.py, beside this script on the node (python -I leaves the script's own
    directory off sys.path; bin/ is root's), loaded by its file name; in the source tree
    (this file is files/health/health.py) files/engine_client/engine_client.py."""
    here = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(here, "engine_client.py")
    if not os.path.isfile(path) and __file__.endswith(".py"):
        path = os.path.join(os.path.dirname(here), "engine_client", "engine_client.py")
    spec = importlib.util.spec_from_file_location("engine_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine = _engine_client()

KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
PROBE_S = 5.0  # one GET /health at most (never past the check's deadline)
LAST_PROBE_S = 0.5  # the least time left worth a probe
CHAT_SHOWN = 200  # characters of the chat's answer kept in the report


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
        return [
            "the engine log of this start has no 'GPU KV cache size' / 'Maximum concurrency' line"
        ]
    if tokens is not None and seen["tokens"] != tokens:
        problems.append(
            f"vLLM logged GPU KV cache size {seen['tokens']:,} tokens, plan-kv expected {tokens:,}"
        )
    if concurrency is not None and seen["concurrency"] != concurrency:
        problems.append(
            f"vLLM logged maximum concurrency {seen['concurrency']}x, plan-kv "
            f"expected {concurrency}x"
        )
    if max_model_len is not None and seen.get("max_model_len") != max_model_len:
        problems.append(
            f"vLLM logged max model len {seen.get('max_model_len')}, the recipe "
            f"asks {max_model_len}"
        )
    return problems


def read_key(path):
    """The API key: the first line of a plain key file (servefleet's etc/api-key)."""
    if not path:
        return None
    with open(path) as handle:
        return handle.readline(4096).strip() or None


class Unit:
    """What systemd says of the unit (nothing when no unit is given, e.g. no systemd)."""

    def __init__(self, name):
        self.name = name

    def show(self):
        if not self.name:
            return {}
        out = subprocess.run(
            ["systemctl", "show", "-p", "ActiveState,SubState,NRestarts,InvocationID", self.name],
            capture_output=True,
            text=True,
        ).stdout
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


def get_health(url, deadline):
    """(status, error) of one GET /health, read within `deadline` (a Deadline) and 5 s."""
    try:
        answer = engine.request(
            url, "GET", "/health", deadline.sooner(PROBE_S), what="/health", max_bytes=64 << 10
        )
    except engine.EngineError as exc:
        return None, str(exc)
    try:
        answer.body()
        return answer.status, None if answer.status == 200 else f"HTTP {answer.status}"
    except engine.EngineError as exc:
        return None, str(exc)
    finally:
        answer.close()


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


def wait_healthy(url, unit, deadline, sleep=time.sleep, now=time.monotonic):
    """None once /health answers 200 before `deadline` (a Deadline, or seconds from now), else
    why not."""
    if not isinstance(deadline, engine.Deadline):
        deadline = engine.Deadline(deadline, now)
    baseline = int(unit.show().get("NRestarts") or 0)
    while True:
        status, error = get_health(url, deadline)
        if status == 200:
            return None
        last = error or f"HTTP {status}"
        trouble = unit_trouble(unit, unit.show(), baseline)
        if trouble:
            return f"{trouble} before /health answered 200 (last answer: {last})"
        if deadline.left() < LAST_PROBE_S:  # no probe that the deadline would cut short
            return f"no healthy /health at {url} after {deadline.seconds:g} s (last answer: {last})"
        sleep(max(0.0, min(1.0, deadline.left() - LAST_PROBE_S)))


def settle(url, unit, seconds, sleep=time.sleep):
    """/health stays 200 and the unit keeps its invocation for `seconds` (each probe within
    5 s: the period ends within seconds + 5)."""
    first = unit.show()
    period = engine.Deadline(seconds)
    while not period.passed():
        sleep(max(0.0, min(1.0, period.left())))
        status, error = get_health(url, engine.Deadline(PROBE_S))
        state = unit.show()
        if state and state.get("InvocationID") != first.get("InvocationID"):
            return f"{unit.name} restarted during the {seconds} s settle period"
        trouble = unit_trouble(unit, state, int(first.get("NRestarts") or 0))
        if trouble:
            return f"{trouble} during the {seconds} s settle period"
        if status != 200:
            return f"/health answered {error or status} during the {seconds} s settle period"
    return None


def chat(url, model, key, deadline):
    """(text, None) when one short chat completion answers with a message before `deadline`
    (a Deadline), else (None, why)."""
    body = {
        "model": model,
        "max_tokens": 16,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello in one word."}],
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    what = "chat completion"
    try:
        answer = engine.request(
            url, "POST", "/v1/chat/completions", deadline, body, headers, what=what
        )
        try:
            doc = answer.expect(200).json()
        finally:
            answer.close()
        choices = engine.items(engine.field(doc, "choices", what), f"{what}: 'choices'")
        if not choices:
            raise engine.EngineError(f"{what}: 'choices' is empty")
        choice = engine.obj(choices[0], f"{what}: choice 0")
        message = engine.obj(engine.field(choice, "message", what), f"{what}: 'message'")
        content = engine.text(message.get("content"), f"{what}: 'content'", optional=True)
        reasoning = engine.text(
            message.get("reasoning_content"), f"{what}: 'reasoning_content'", optional=True
        )
    except engine.EngineError as exc:
        return None, str(exc)
    return (content or reasoning or "")[:CHAT_SHOWN], None


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
        deadline = engine.Deadline(args.timeout)  # the wait and the chat, together
        waited = wait_healthy(args.url, unit, deadline)
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
                report["expected"] = {
                    "tokens": args.expect_tokens,
                    "concurrency": args.expect_concurrency,
                }
                problems += compare(
                    seen, args.expect_tokens, args.expect_concurrency, args.max_model_len
                )
            text, error = chat(args.url, args.model, read_key(args.key_file), deadline)
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
