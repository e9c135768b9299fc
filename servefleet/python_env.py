"""Python package sources and installer arguments, from recipe data (mirrors, wheelhouses)."""

import shlex


def source_args(data) -> list[str]:
    """Index / extra index / find-links arguments for pip or uv pip, from data."""
    args = []
    if data.get("pip_index_url"):
        args += ["--index-url", data["pip_index_url"]]
    for url in data.get("pip_extra_index_urls") or []:
        args += ["--extra-index-url", url]
    for link in data.get("pip_find_links") or []:
        args += ["--find-links", link]
    return args


def install_args(data, pinned: bool = False) -> str:
    """Extra install arguments as one shell string; --no-deps for pinned wheelhouse installs."""
    args = source_args(data)
    if pinned and data.get("python_no_deps"):
        args.append("--no-deps")
    return " ".join(shlex.quote(a) for a in args)
