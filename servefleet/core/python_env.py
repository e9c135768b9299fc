"""Python package sources and installer arguments, from recipe data (mirrors, wheelhouses)."""

from __future__ import annotations


def source_args(data) -> list[str]:
    """Index / extra index / find-links arguments for pip or uv pip, from data (a mapping or
    pyinfra's HostData, which has .get() but no [])."""
    args = []
    if data.get("pip_index_url"):
        args += ["--index-url", data.get("pip_index_url")]
    for url in data.get("pip_extra_index_urls") or []:
        args += ["--extra-index-url", url]
    for link in data.get("pip_find_links") or []:
        args += ["--find-links", link]
    return args
