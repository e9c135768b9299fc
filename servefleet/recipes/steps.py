"""pyinfra's `@deploy`, typed as it behaves: a recipe step keeps its own parameters and result.

pyinfra types a deploy as a `PyinfraOperation[P]` (pyinfra/api/deploy.py): a call that returns
an `OperationMeta` and takes pyinfra's global arguments (`_sudo`, `name`, ...) before the step's
own, so that a positional argument would be a `_sudo`. At runtime the wrapper passes positional
arguments through and returns what the step returns (`ModelRun`, `ServiceRun`, ...): that is
the type this decorator gives it. Steps are called without global arguments.

    @deploy("Model")
    def ensure_model(repo_id: str, revision: str, include: list[str]) -> ModelRun: ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar, cast

from pyinfra.api import deploy as pyinfra_deploy

P = ParamSpec("P")
R = TypeVar("R")


class Changes(Protocol):
    """What a step depends on: an OperationMeta, or a step result that says whether any of its
    operations changed the node (read at execution time)."""

    def did_change(self) -> bool: ...


def deploy(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`pyinfra.api.deploy(name)`, typed with the step's own signature and result."""
    # The one cast: pyinfra's annotation of the wrapper (PyinfraOperation) is not what it does.
    return cast(Callable[[Callable[P, R]], Callable[P, R]], pyinfra_deploy(name))
