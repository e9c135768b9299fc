"""The answer of a batched fact read (servefleet.facts.batch) split back into one answer per fact.

Each fact's stdout is followed by a line ``NONCE INDEX STATUS`` that the batch prints after a
newline of its own (so output without a final newline still ends its last line): that extra
empty line is dropped again.
"""

from __future__ import annotations


def split_batch(lines: list[str], nonce: str) -> dict[int, tuple[bool, list[str]]]:
    """{index: (exit status was 0, stdout lines)} for every marker found."""
    answers: dict[int, tuple[bool, list[str]]] = {}
    current: list[str] = []
    for line in lines:
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit():
            if current and current[-1] == "":
                current.pop()
            answers[int(parts[1])] = (parts[2] == "0", current)
            current = []
        else:
            current.append(line)
    return answers
