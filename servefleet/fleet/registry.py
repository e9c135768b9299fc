"""Questions about the declared engines and node classes (servefleet.engines, fleet/nodes.py):
which engine a host serves with, which deploy acts on which hosts, which data files hold
defaults. Everything that varies by engine or class asks here instead of naming one."""

from __future__ import annotations

from collections.abc import Iterable

from servefleet.core.declarations import Engine, NodeClass
from servefleet.core.errors import DataError
from servefleet.core.knobs import GENERIC_DEPLOYS
from servefleet.engines import ENGINES
from servefleet.fleet.nodes import NODE_CLASSES

assert len({e.name for e in ENGINES} | {n.name for n in NODE_CLASSES}) == len(ENGINES) + len(
    NODE_CLASSES
), "an engine and a node class share a name (they are inventory groups and data files)"


def engine(name: str) -> Engine:
    return next(e for e in ENGINES if e.name == name)


def engine_of_deploy(label: str | None) -> Engine | None:
    """The engine whose deploy is deploys/<label>.py, None for any other deploy."""
    return next((e for e in ENGINES if e.deploy == label), None)


def engine_of_release(label: str | None) -> Engine | None:
    """The engine a release record names (Release.engine)."""
    return next((e for e in ENGINES if e.label == label), None)


def serving_engine(label: str | None, what: str) -> Engine:
    """The engine deploys/<label>.py serves; DataError (one line, naming the serving deploys)
    when it is no serving deploy."""
    found = engine_of_deploy(label)
    if found is None:
        serving = " or ".join(f"deploys/{d}.py" for d in serving_deploys())
        raise DataError(f"{what} is not a serving recipe ({serving})")
    return found


def node_class_of(groups: Iterable[str]) -> NodeClass | None:
    groups = list(groups)
    return next((n for n in NODE_CLASSES if n.name in groups), None)


def engine_of(groups: Iterable[str]) -> Engine | None:
    """The engine a host serves with: the engine group it is in (fleet.yml `engine:`), else its
    class's default one; None for a class without an engine (the depot)."""
    groups = list(groups)
    named = next((e for e in ENGINES if e.name in groups), None)
    if named is not None:
        return named
    cls = node_class_of(groups)
    return engine(cls.engine) if cls is not None and cls.engine else None


def role_name(groups: Iterable[str]) -> str | None:
    """A host's role as status and the testbed name it: its node class, with `-<engine>` where
    the engine is not the class's own (spark, spark-llamacpp)."""
    groups = list(groups)
    cls, served = node_class_of(groups), engine_of(groups)
    if cls is None:
        return None
    return cls.name if served is None or served.name == cls.engine else f"{cls.name}-{served.name}"


def parse_role(role: str) -> tuple[NodeClass, Engine | None]:
    """`spark` -> (the class, its engine); `spark-llamacpp` -> (the class, that engine);
    ValueError naming the forms for anything else."""
    for cls in NODE_CLASSES:
        if role == cls.name:
            return cls, engine(cls.engine) if cls.engine else None
        for e in ENGINES:
            if cls.engine and role == f"{cls.name}-{e.name}":
                return cls, e
    raise ValueError(f"{role!r} is no role: expected one of {', '.join(role_names())}")


def role_names() -> list[str]:
    """Every role: each node class, and each class with an engine with each other engine."""
    names = []
    for cls in NODE_CLASSES:
        names.append(cls.name)
        names += [f"{cls.name}-{e.name}" for e in ENGINES if cls.engine and e.name != cls.engine]
    return names


def serving_deploys() -> tuple[str, ...]:
    return tuple(e.deploy for e in ENGINES)


def all_deploys() -> tuple[str, ...]:
    """Every deploy label: deploys/<label>.py."""
    return GENERIC_DEPLOYS + serving_deploys()


def applies(recipe: str | None, groups: Iterable[str]) -> bool:
    """A serving deploy acts only on hosts of its engine, a class's own deploy (the depot's)
    only on that class's hosts; every other deploy on every host."""
    groups = list(groups)
    served = engine_of_deploy(recipe)
    if served is not None:
        return engine_of(groups) == served
    own = next((n for n in NODE_CLASSES if n.deploy and n.deploy == recipe), None)
    return own is None or own.name in groups


def whose(recipe: str) -> str:
    """The hosts a deploy acts on, for a no-op's message: 'vLLM', 'depot'."""
    served = engine_of_deploy(recipe)
    if served is not None:
        return served.title
    own = next((n for n in NODE_CLASSES if n.deploy == recipe), None)
    return own.name if own else "every"


def keeps_store(groups: Iterable[str]) -> bool:
    """Does this host keep the fleet's model store (the depot's account and directory)?"""
    cls = node_class_of(groups)
    return bool(cls and cls.store)


def default_files() -> tuple[str, ...]:
    """The group_data files that hold defaults of fleet knobs: all.py, one per node class, one
    per engine (testbed*.py only override them, or declare testbed-only knobs)."""
    return ("all", *(n.name for n in NODE_CLASSES), *(e.name for e in ENGINES))
