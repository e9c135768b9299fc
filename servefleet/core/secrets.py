"""Operator-side secret files (API key, hub token): read and checked the same way for every
engine. A secret is one line of URL-safe characters; anything else is refused, so it cannot
add a line to an environment file or a unit."""

from __future__ import annotations

import re
from pathlib import Path

from servefleet.core.operator_files import FileRefused, read_regular

SECRET_RE = re.compile(r"[A-Za-z0-9._~+/=:@-]{8,4096}")
EXPECTED = "one line of 8 to 4096 characters from A-Z a-z 0-9 . _ ~ + / = : @ -"
# What is read at most: above any secret, so a long one is still refused by the check below.
MAX_SECRET_FILE_BYTES = 64 << 10


class SecretError(ValueError):
    """Why a secret file is refused (never contains the secret)."""


def read_secret(path: str | Path) -> str:
    """The secret in `path` (operator side); SecretError naming the problem, never the value."""
    p = Path(path).expanduser()
    try:
        # never a FIFO (hangs) or /dev/zero; never a file another user may change
        raw = read_regular(p, MAX_SECRET_FILE_BYTES, key="secret")
    except FileNotFoundError:
        raise SecretError(f"{p} does not exist") from None
    except OSError as exc:
        raise SecretError(f"{p} cannot be read ({exc.strerror})") from None
    except FileRefused as exc:
        raise SecretError(str(exc)) from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise SecretError(f"{p} holds non-ASCII bytes; expected {EXPECTED}") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise SecretError(f"{p} is empty; expected {EXPECTED}")
    if "\n" in text or "\r" in text:
        raise SecretError(f"{p} holds more than one line; expected {EXPECTED}")
    if not SECRET_RE.fullmatch(text):
        raise SecretError(
            f"{p} holds characters outside the allowed set or is too short/long; "
            f"expected {EXPECTED}"
        )
    return text
