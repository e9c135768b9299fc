"""The tree's code style, as pyinfra keeps its own: ruff's formatter and linter at 100 columns
(pyproject.toml [tool.ruff]) and mypy on the product package ([tool.mypy]). A test, so that
README's test command is also the style check."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]


def test_the_tree_is_formatted():
    out = subprocess.run(
        [*RUFF, "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, f"run `ruff format .`:\n{out.stdout[-3000:]}{out.stderr[-1000:]}"


def test_the_linter_finds_nothing():
    out = subprocess.run([*RUFF, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, f"`ruff check .`:\n{out.stdout[-3000:]}{out.stderr[-1000:]}"


def test_the_product_package_type_checks():
    # pyproject.toml [tool.mypy]: files = servefleet, as pyinfra types itself.
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, f"`mypy`:\n{out.stdout[-3000:]}{out.stderr[-1000:]}"
