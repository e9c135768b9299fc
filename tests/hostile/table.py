"""The hostile-input table: each case is one hostile or malformed input and its own expected
outcome. A case is either refused with a named error (`refused`: the message must contain the
expected text, and the refusal must be one line, no traceback) or harmless (`harmless`: the
proof is checked by the case's own function: the rendered unit has no extra directive, the file
system is unchanged, the secret is absent from argv and logs).

Category modules (tests/hostile/cases_*.py) export `CASES: list[Case]`;
tests/hostile/test_hostile.py runs them all and prints: tried, handled, failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CATEGORIES = (
    "data values",
    "fleet.yml files",
    "GGUF files",
    "safetensors indexes",
    "config.json",
    "hub requests",
    "hub answers",
    "depot paths",
    "patch targets",
    "key files",
    "crash inputs",
    "model directories",
    "command-line arguments",
    "node records",
    "node output",
    "engine answers",
    "host keys",
    "service identity",
    "directories",
)


@dataclass(frozen=True)
class Case:
    category: str  # one of CATEGORIES
    name: str  # what the input is, in a few words
    expect: str  # "refused: <text the error names>" or "harmless: <the proof checked>"
    check: Callable[[], None]  # raises AssertionError when the input is not handled as expected

    @property
    def id(self) -> str:
        return f"{self.category}: {self.name}"


def refused(category: str, name: str, expected_text: str, attempt: Callable[[], str | None]):
    """A case whose input must be refused: attempt() returns the one-line error it got (None
    when the input was accepted)."""

    def check():
        message = attempt()
        assert message is not None, f"accepted; expected a refusal naming {expected_text!r}"
        assert "Traceback" not in message, f"a traceback instead of one line: {message[-500:]}"
        assert expected_text in message, (
            f"refused, but the message {message!r} does not name {expected_text!r}"
        )

    return Case(category, name, f"refused: {expected_text}", check)


def harmless(category: str, name: str, proof: str, check: Callable[[], None]):
    return Case(category, name, f"harmless: {proof}", check)
