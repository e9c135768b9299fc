"""Typed schema of the recipe data (group_data/, inventory/fleet.yml, --data).

Every deploy validates `host.data` first. A missing or malformed value raises DataError while
pyinfra is still preparing operations, so the whole run stops before any host is changed.
Keys are documented where their defaults are set: group_data/all.py and the role files.
"""

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable

from pyinfra.api.exceptions import PyinfraError


class DataError(PyinfraError):
    """Invalid recipe data; the message names host, key, value and the expected form."""


@dataclass(frozen=True)
class Check:
    expected: str  # the expected form, in words, for error messages
    ok: Callable[[Any], bool]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    words = "an integer" + (f" >= {lo}" if lo is not None and hi is None else "")
    if lo is not None and hi is not None:
        words = f"an integer from {lo} to {hi}"
    return Check(words, lambda v: _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi))


BOOL = Check("true or false", lambda v: isinstance(v, bool))
TEXT = Check("a non-empty string", lambda v: isinstance(v, str) and v.strip() != "")
ABS_PATH = Check("an absolute path", lambda v: isinstance(v, str) and v.startswith("/"))
URL = Check("an http(s) URL", lambda v: isinstance(v, str) and re.match(r"^https?://\S+$", v) is not None)
NAME = Check("a name of letters, digits, '.', '_' or '-'",
             lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]+", v) is not None)
REVISION = Check("a branch, tag or 40-hex commit sha",
                 lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._/-]+", v) is not None)
REPO_ID = Check("a hub repo id like org/name",
                lambda v: isinstance(v, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", v) is not None)


def _ip_ok(v) -> bool:
    try:
        ipaddress.ip_address(v)
        return True
    except (ValueError, TypeError):
        return False


IP = Check("an IP address (0.0.0.0 binds every interface)", _ip_ok)


def one_of(*choices) -> Check:
    return Check("one of " + ", ".join(repr(c) for c in choices), lambda v: v in choices)


def optional(check: Check) -> Check:
    return Check(f"{check.expected} or None", lambda v: v is None or check.ok(v))


def list_of(check: Check) -> Check:
    return Check(f"a list, each {check.expected}",
                 lambda v: isinstance(v, (list, tuple)) and all(check.ok(x) for x in v))


def dict_of(key: Check, value: Check) -> Check:
    return Check(f"a dict of {key.expected} -> {value.expected}",
                 lambda v: isinstance(v, dict) and all(key.ok(k) and value.ok(x) for k, x in v.items()))


# The keys every deploy shares (the base deploy). Role recipes add their own below.
BASE = {
    "servefleet_root": ABS_PATH,
    "servefleet_user": NAME,
    "require_gpu": BOOL,
    "min_driver_version": integer(1),
    "expected_arch": optional(one_of("x86_64", "aarch64")),
    "min_free_disk_bytes": integer(0),
    "usable_memory_bytes": optional(integer(1)),
    "os_packages": dict_of(NAME, list_of(NAME)),
    "python_interpreter": dict_of(NAME, TEXT),
    "uv_version": TEXT,
    "pip_index_url": optional(URL),
    "pip_extra_index_urls": list_of(URL),
    "pip_find_links": list_of(TEXT),
    "python_no_deps": BOOL,
    "service_state": one_of("running", "stopped"),
    "service_enabled": BOOL,
    "service_host": IP,
    "service_port": integer(1, 65535),
    "api_key_file": optional(TEXT),
    "hf_endpoint": URL,
    "hf_token_file": optional(TEXT),
    "model_source": one_of("hub", "depot"),
    "depot_host": optional(TEXT),
}


def _show(value) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def validate(host, keys: dict[str, Check]) -> None:
    """Raise DataError for the first missing or malformed key of this host."""
    problems = []
    for key, check in keys.items():
        value = host.data.get(key)
        if value is None and not check.ok(None):
            problems.append(f"key {key!r} is missing; expected {check.expected}")
        elif not check.ok(value):
            problems.append(
                f"key {key!r} = {_show(value)} ({type(value).__name__}); expected {check.expected}")
    if host.data.get("model_source") == "depot" and not host.data.get("depot_host"):
        problems.append("key 'depot_host' is missing; expected the depot's inventory name "
                        "when model_source = 'depot'")
    if problems:
        raise DataError(
            f"invalid data for host {host.name}: " + "; ".join(problems)
            + " (set in group_data/*.py, inventory/fleet.yml or --data); nothing was changed")
