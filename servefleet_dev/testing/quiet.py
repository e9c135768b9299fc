"""A quiet machine for the tests whose assertions are timings (the rollout's performance gate).

The test session runs three workers and a prefetch on two cores; a bench measured beside a
compile or another worker's converge is 2-20x off (measured in CI: TTFT 0.065 -> 1.483 s on
an unchanged server), so a gate test would fail or pass by accident. Every test holds the
machine-wide lock shared; a test marked `quiet` holds it exclusively, so it runs alone. The
lock is a reader-writer lock that prefers the writer: each reader passes a turnstile the
writer holds while it waits, so a stream of short unit tests cannot starve it.

Locks live in the cache's locks/ directory: test runs of other checkouts on the same machine
share the CPU, so they share the lock too.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from servefleet.core.paths import cache_subdir


def _files():
    locks = cache_subdir("locks")
    return open(locks / "quiet-turnstile.lock", "a"), open(locks / "quiet.lock", "a")


HELD = "SERVEFLEET_QUIET_HELD"  # set while held: a child (a pytest run in a test) holds it too


@contextmanager
def shared() -> Iterator[None]:
    """The CPU is shared with other shared holders, never with an exclusive one."""
    if os.environ.get(HELD):  # the parent holds it: waiting here would wait on ourselves
        yield
        return
    turnstile, lock = _files()
    with turnstile, lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # a waiting writer holds it: wait behind it
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        os.environ[HELD] = "1"
        try:
            yield
        finally:
            del os.environ[HELD]


@contextmanager
def exclusive() -> Iterator[None]:
    """Nothing else that holds the lock runs meanwhile (the current holders finish first)."""
    turnstile, lock = _files()
    with turnstile, lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # new readers queue here
        fcntl.flock(lock, fcntl.LOCK_EX)  # the readers inside finish
        yield
