"""Engine flags a recipe sets from data, which extra arguments may not set again.

Engines take the last of a repeated flag, so extra arguments that set `--host` would bind past
the loopback-or-key rule and `--api-key` would put the key into argv and the 0644 unit. Each
engine declares its table (flag -> the data key that sets it) and the knob of its extra
arguments (servefleet.core.declarations.Engine); this checks one against the other.
"""

from __future__ import annotations

from collections.abc import Mapping


def _name(arg: str, underscores: bool) -> str:
    name = arg.split("=", 1)[0]
    return name.replace("_", "-") if underscores and name.startswith("--") else name


def owned_flag_problems(
    key: str, args, owned: Mapping[str, str], abbreviations: bool = False
) -> list[str]:
    """One line per argument of `key` that sets a recipe-owned flag: exactly, as --flag=value,
    and for an argparse engine (abbreviations) with underscores or as an abbreviation (a prefix
    of an owned long flag)."""
    problems = []
    for arg in args or ():
        if not isinstance(arg, str) or not arg.startswith("-") or arg == "-":
            continue
        name = _name(arg, underscores=abbreviations)
        hit = owned.get(name)
        if hit is None and abbreviations and name.startswith("--") and len(name) > 3:
            hit = next(
                (who for flag, who in owned.items() if flag.startswith(name) and flag != name), None
            )
        if hit is not None:
            problems.append(
                f"key {key!r}: {arg!r} sets what the recipe sets from {hit}; "
                f"set that instead (extra arguments may not override it)"
            )
    return problems
