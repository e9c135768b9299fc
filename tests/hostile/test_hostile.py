"""The hostile-input suite: every case of tests/hostile/cases_*.py, table-driven.

Prints the count (tried, handled, failed) at the end of the run; CI requires 0 failed.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import tests.hostile as package
from tests.hostile.table import CATEGORIES

CASES = []
for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
    if info.name.startswith("cases_"):
        CASES += importlib.import_module(f"tests.hostile.{info.name}").CASES


def test_every_category_has_at_least_ten_cases():
    for category in CATEGORIES:
        count = sum(c.category == category for c in CASES)
        assert count >= 10, f"{category}: {count} cases"
    assert len(CASES) >= 150, len(CASES)
    assert len({c.id for c in CASES}) == len(CASES), "two cases share a name"


@pytest.mark.hostile
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case):
    case.check()
