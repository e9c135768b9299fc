"""Many facts in one round trip: a recipe plans the facts its steps will read, and the first
read of any of them runs all their commands as one shell command.

pyinfra runs one SSH command per fact read, and pyinfra 3 does not cache reads: a no-op check
of the node base cost 23 commands per node. With a plan, a no-op check costs one.

    batch.plan(host, [(CpuArch, {}), (FreeDiskBytes, {"path": "/opt/servefleet"})])
    batch.get(host, CpuArch)          # runs both commands now, in one command; "x86_64"
    batch.get(host, FreeDiskBytes, path="/opt/servefleet")   # from the same answer
    batch.forget(host)                # an operation changed the node: the next read is fresh

A read of a fact that is not planned is an ordinary `host.get_fact`. Each fact keeps its own
command and parser, so each stays unit-testable on its own and means the same batched or not:
its exit status and stdout are separated by a marker line carrying a random nonce (a file the
fact prints cannot forge a marker). An empty stdout or a missing `requires_command` tool gives
the fact's default, as pyinfra does. A fact whose status is not 0, or whose answer was cut
short (no marker after it), is read again alone: pyinfra then fails the host as it does for
that fact alone, never a default that looks like an answer.

A plan may grow as the steps learn more (a path that depends on another fact's answer): the
first read of a planned fact without an answer reads every planned fact without one.

An operation that ran commands on a host makes the host's next operation read afresh (a state
callback: any operation, pyinfra's own too). Within an operation, one that reads the node back
after its own command calls `forget(host)` after the `yield` (that code runs only once the
command has executed). Detecting changes (pyinfra's prepare stage) executes nothing, so it
forgets nothing: one read serves every step.
"""

from __future__ import annotations

import secrets
import weakref
from typing import TypeVar

from pyinfra.api import FactBase, Host, StringCommand
from pyinfra.api.state import BaseStateCallback

from servefleet.core.batch import split_batch

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # host -> [keys]
_ANSWERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # host -> {key: value}
_LAST_OP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # host -> (state, op hash)


class _ForgetAfterCommands(BaseStateCallback):
    """Whatever operation ran commands on a host (pyinfra's own included), the answers read
    before it may be stale: the host's next operation starts from fresh reads."""

    @staticmethod
    def operation_host_start(state, host, op_hash):
        # The last operation of this run: one process may run several (the demo, rebuild,
        # rollout), and a host of a later run can be the same key as one of an earlier run.
        last = _LAST_OP.get(host)
        done = state.ops.get(host, {}).get(last[1]) if last and last[0]() is state else None
        if done is not None and done.operation_meta.executed:
            forget(host)
        _LAST_OP[host] = (weakref.ref(state), op_hash)


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _key(cls, kwargs: dict) -> tuple:
    return (cls, _frozen(kwargs))


T = TypeVar("T")
Answers = dict[int, tuple[bool, list[str]]]  # {index: (exit status was 0, stdout lines)}


class Batch(FactBase[Answers]):
    """The answers of several facts, by their position: ``[(ok, stdout lines), ...]``."""

    def command(self, nonce: str, commands: tuple[str, ...]) -> str:
        self.nonce = nonce  # process() reads it (pyinfra calls both on one instance)
        # Each fact in a subshell, stderr dropped as pyinfra drops it for a fact; the marker
        # line after it carries its index and exit status.
        return "; ".join(
            f"( {cmd}\n) 2>/dev/null; printf '\\n{nonce} {i} %s\\n' \"$?\""
            for i, cmd in enumerate(commands)
        )

    @staticmethod
    def default() -> Answers:
        return {}  # pyinfra's answer for no output: every fact is then read again alone

    def process(self, output: list[str]) -> Answers:
        return split_batch(output, self.nonce)


def plan(host: Host, facts: list[tuple[type[FactBase], dict]]) -> None:
    """Facts `host`'s steps will read (fact class, keyword arguments): read together on the
    first read of any. Adds to what is planned already."""
    if not any(isinstance(h, _ForgetAfterCommands) for h in host.state.callback_handlers):
        host.state.add_callback_handler(_ForgetAfterCommands())
    keys = _PLANS.setdefault(host, [])
    for cls, kwargs in facts:
        key = _key(cls, kwargs)
        if key not in keys:
            keys.append(key)


def forget(host: Host) -> None:
    """The node changed: the next read of a planned fact reads them all again."""
    _ANSWERS.pop(host, None)


MISSING = "##servefleet-no-command##"


def _text(command) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def command_of(cls: type[FactBase], kwargs: dict) -> str:
    """The shell command `cls` runs for these arguments, as text; guarded by its
    requires_command as pyinfra guards it (a marker line when the tool is missing)."""
    fact = cls()
    command = _text(fact.command(**dict(kwargs)) if callable(cls.command) else cls.command)
    needs = fact.requires_command(**dict(kwargs))
    if needs:
        return (
            f"if command -v {_text(needs)} >/dev/null 2>&1; then ( {command}\n); "
            f"else echo '{MISSING}'; fi"
        )
    return command


def answers(keys: list, results: Answers) -> dict:
    """{key: value} from a Batch answer: each fact's own parser on its own stdout; its default
    where it failed or printed nothing (as pyinfra's get_fact)."""
    values = {}
    for index, (cls, kwargs) in enumerate(keys):
        ok, lines = results.get(index, (False, []))
        fact = cls()
        if ok and lines and lines != [MISSING]:  # a missing tool: the default, as pyinfra 3
            if callable(cls.command):
                fact.command(**dict(kwargs))  # a fact may keep what process() needs
            values[(cls, kwargs)] = fact.process(lines)
        else:
            values[(cls, kwargs)] = fact.default()
    return values


def get(host: Host, cls: type[FactBase[T]], **kwargs) -> T:
    """The fact's value: from the batch when it is planned, else `host.get_fact`. The first
    read of a planned fact without an answer reads every planned fact without one."""
    key = _key(cls, kwargs)
    planned = _PLANS.get(host, [])
    if key not in planned:
        return host.get_fact(cls, **kwargs)
    known = _ANSWERS.setdefault(host, {})
    if key not in known:
        todo = [k for k in planned if k not in known]
        commands = tuple(command_of(c, dict(kw)) for c, kw in todo)
        results = host.get_fact(Batch, nonce=secrets.token_hex(8), commands=commands)
        known.update(answers(todo, results or {}))
        # Fewer answers than facts (none at all included): the reader stopped early (pyinfra's
        # stops at a line that is not UTF-8). A read that failed has failed the host already.
        if host not in host.state.failed_hosts:
            for index, (c, kw) in enumerate(todo):
                if not results.get(index, (False, []))[0]:
                    # Failed, or cut short (no marker): read alone, so that pyinfra does what
                    # it does with that fact alone (it fails the host, with its one line).
                    known[(c, kw)] = host.get_fact(c, **dict(kw))
    return known[key]
