"""Byte counts as operators write them: one parser for every place that takes one (fleet.yml's
`data:`, `--data`, group_data files and `servefleet plan-kv`).

A size is a whole number of bytes (8589934592), or a number with a binary unit: K, M, G, T or P,
with or without `iB` (8G = 8GiB = 8 * 2**30; 512M; 1.5GiB). Decimal SI units (8GB, 512kB) and
lower-case units are refused, not guessed: vLLM's own `8g` and `8G` differ, and 8GB beside 8GiB
is a 7% surprise in a memory budget.
"""

from __future__ import annotations

import re
from fractions import Fraction

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
EXPECTED = (
    "a byte count: an integer, or a number with a binary unit K, M, G, T, P with or without "
    "'iB' (8G = 8GiB, 512M, 1.5GiB)"
)
_PLAIN = re.compile(r"[0-9]{1,20}")
_WITH_UNIT = re.compile(r"([0-9]{1,20})(?:\.([0-9]{1,9}))?([KMGTP])(?:iB)?")
_SI = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[kKMGTP]B|[kmgtp](?:iB|B)?)")


class SizeError(ValueError):
    """Not a byte count; the message says what was given (bounded) and what is expected."""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_size(value) -> int:
    """The number of bytes `value` names: an int as it is, a string in one of the forms above.
    SizeError otherwise (a bool, a float, a fraction of a byte, 8GB)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise SizeError(f"{_shown(value)} ({type(value).__name__}) is not {EXPECTED}")
    if _PLAIN.fullmatch(value):
        return int(value)
    match = _WITH_UNIT.fullmatch(value)
    if match is None:
        if _SI.fullmatch(value):
            raise SizeError(
                f"{_shown(value)}: decimal and lower-case units are not taken (is it 10**9 or "
                f"2**30?); expected {EXPECTED}"
            )
        raise SizeError(f"{_shown(value)} is not {EXPECTED}")
    whole, frac, unit = match.groups()
    count = Fraction(int(whole)) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    total = count * UNITS[unit]
    if total.denominator != 1:
        raise SizeError(f"{_shown(value)} is not a whole number of bytes")
    return int(total)


def is_size(value) -> bool:
    try:
        parse_size(value)
    except SizeError:
        return False
    return True
