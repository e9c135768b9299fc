"""Python package sources and installer arguments, from recipe data (mirrors, wheelhouses)."""

from __future__ import annotations

# The environment of every uv command on a node: the system's CA store (a site's proxy CA), never
# a Python uv downloads itself, no progress bars in the logs.
UV_ENV = {"UV_SYSTEM_CERTS": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}


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


def public_version(version: str) -> str:
    """2.11.0+cu130 -> 2.11.0: a pin without a local label matches any local label (PEP 440)."""
    return version.split("+", 1)[0]


def version_problems(
    found: dict[str, str],
    wanted: dict[str, str],
    cuda: str | None,
    wanted_cuda: str | None,
    venv: str,
) -> list[str]:
    """What differs between the venv and the pins; [] when it is as data says."""
    problems = []
    for name, pin in wanted.items():
        have = found.get(name)
        if have is None:
            problems.append(f"{name} is not installed in {venv} (pinned {name}=={pin})")
        elif public_version(have) != pin:
            problems.append(f"{name} {have} is installed in {venv}, the pin is {name}=={pin}")
    if wanted_cuda and "torch" in found and cuda != wanted_cuda:
        problems.append(
            f"torch.version.cuda is {cuda or 'None (a CPU build)'} in {venv}, the "
            f"recipe needs CUDA {wanted_cuda}: install torch from an index that "
            f"serves the cu{wanted_cuda.replace('.', '')} build"
        )
    return problems


def versions_match(found: dict[str, str], wanted: dict[str, str]) -> bool:
    return all(name in found and public_version(found[name]) == pin for name, pin in wanted.items())
