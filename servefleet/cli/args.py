"""Arguments the commands share: --data KEY=VALUE, read as pyinfra's --data reads it."""

from __future__ import annotations

from pyinfra_cli.util import parse_cli_arg


def parse_data(pairs: list[str]) -> dict:
    """KEY=VALUE pairs as pyinfra's --data reads them (JSON, ints and booleans parsed)."""
    data = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        data[key] = parse_cli_arg(value)
    return data
