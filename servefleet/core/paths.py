"""Where servefleet keeps things on the operator's machine (never inside the project)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """Big downloads and builds, kept across runs: $SERVEFLEET_CACHE or ~/.cache/servefleet."""
    path = Path(os.environ.get("SERVEFLEET_CACHE") or Path.home() / ".cache" / "servefleet")
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_subdir(name: str) -> Path:
    path = cache_dir() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
