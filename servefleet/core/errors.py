"""servefleet's errors and exit codes: one meaning per code, for every verb (docs/day2.md,
Exit codes)."""

from __future__ import annotations

from enum import IntEnum

from pyinfra.api.exceptions import PyinfraError


class Exit(IntEnum):
    OK = 0  # done, and every host is as the data says (in sync, healthy, upgraded)
    DIFFERS = 1  # done, but a host differs or failed (drift, a failed host, rolled back, untouched)
    BAD_INPUT = 2  # refused before touching anything: data, fleet file, arguments, unsafe request
    UNREACHABLE = 3  # a host could not be reached or checked; nothing was changed on it
    NEEDS_ATTENTION = 4  # a host could not be brought back to a healthy release (rollout, rollback)
    INTERRUPTED = 130  # stopped by Ctrl-C / SIGTERM; rerun the same command to finish


EXIT_DOCS = {
    Exit.OK: "done; every host is as the data says (in sync, healthy, upgraded)",
    Exit.DIFFERS: "done, but a host differs or failed: drift found, a converge or health check "
    "failed, a rollout rolled a host back or left hosts untouched, bench failed",
    Exit.BAD_INPUT: "refused before any host was touched: invalid data, fleet.yml, key file, "
    "model file, arguments, or an unsafe request (e.g. rebuild of too many hosts)",
    Exit.UNREACHABLE: "a host could not be reached or its facts read; it was not changed "
    "(wins over 1)",
    Exit.NEEDS_ATTENTION: "rollout/rollback: a host is not serving a healthy release and could "
    "not be brought back (no previous release, or the rollback failed); "
    "wins over 1 and 3",
    Exit.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM); nodes keep serving what they ran; rerun "
    "the same command",
}


class DataError(PyinfraError):
    """Invalid input (data, fleet file, key file): the message is one line naming the host or
    file, the key, the value and what was expected. Nothing has been changed when it is raised."""

    exit_code = Exit.BAD_INPUT


class InputError(ValueError):
    """A bad file or argument given to a verb that needs no project (inspect, plan-kv)."""

    exit_code = Exit.BAD_INPUT
