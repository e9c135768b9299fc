"""Clients of a running hub's operator endpoints (tests, benchmarks, the testbed), and `main`:
`python -m servefleet_dev.hub serve|publish|stats|fault ...`, the same commands as `servefleet hub`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

# servefleet_dev.cli.hub imports this package in turn (`from servefleet_dev import hub`): the cycle
# is safe because each side only reads the other's attributes when a command runs, not on import.


def _control_call(url: str, method: str, route: str, doc=None):
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(f"{url.rstrip('/')}/_servefleet/{route}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def hub_stats(url: str, reset: bool = False) -> dict:
    """The server's byte counters ({"total_bytes", "repos", "files", ...}); reset=True zeroes them."""
    return (
        _control_call(url, "POST", "stats/reset", {})
        if reset
        else _control_call(url, "GET", "stats")
    )


def set_fault(
    url: str,
    pattern: str = "*",
    *,
    bytes_per_second: int | None = None,
    drop_after: int | None = None,
    times: int | None = None,
) -> list[dict]:
    """Throttle and/or cut GETs of files matching "org/name/path" pattern; returns the rules."""
    rule = {
        "pattern": pattern,
        "bytes_per_second": bytes_per_second,
        "drop_after": drop_after,
        "times": times,
    }
    return _control_call(url, "POST", "faults", rule)


def clear_faults(url: str) -> None:
    _control_call(url, "DELETE", "faults")


def wait_ready(url: str, timeout: float = 10.0) -> None:
    """Block until the hub at url answers its health check."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _control_call(url, "GET", "health")
            return
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
