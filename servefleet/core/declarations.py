"""What declaring an engine and a node class means: the two types the registries hold.

An engine is declared once, in its own package (servefleet/engines/<name>/__init__.py: `ENGINE`),
and listed once, in servefleet/engines/__init__.py. A node class is declared and listed once,
in servefleet/fleet/nodes.py. Everything else (the inventory's groups, the data files, the knob
docs, the verbs) iterates them: no generic code branches on an engine's or a class's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servefleet.core.drift_items import Item
from servefleet.core.knobs import Knob
from servefleet.core.layout import NodeLayout

Data = Mapping[str, Any]


@dataclass(frozen=True)
class Engine:
    """A serving engine: its deploy, its data, its unit, and what the verbs ask of it."""

    name: str  # package, inventory group and data file: group_data/<name>.py
    title: str  # as output names it ("vLLM")
    label: str  # the engine its release records name (on nodes: never renamed)
    deploy: str  # deploys/<deploy>.py: the recipe's label
    unit: str  # the systemd unit it serves from
    template: str  # the unit's template, under files/<name>/
    version_key: str  # the knob whose value names a release's version
    knobs: tuple[Knob, ...]  # its own knobs (the shared ones: servefleet.fleet.contract)
    reads: tuple[str, ...]  # shared knobs its deploy reads beyond every serving deploy's
    extra_args_key: str  # the knob of further engine arguments
    owned_flags: Mapping[str, str]  # flag -> the knob the recipe sets it from
    abbreviations: bool  # argparse: a prefix of a long flag is that flag
    # (data) -> the files its deploy fetches of the model repo
    model_include: Callable[[Data], list[str]]
    # (host, data, model dir) -> the unit template's variables, as a converge renders them
    unit_context: Callable[[Any, Data, str], dict]
    # (host, data) -> (short, detail) of what is installed, for status
    status: Callable[[Any, Data], tuple[str, str]]
    # (host, data, model dir) -> drift's items of the engine itself (versions, build, patch)
    deep_items: Callable[[Any, Data, str], list[Item]]
    # (a release's gate, read on the node now) -> the health check's engine arguments
    health_args: Callable[[Mapping, bool], list[str]]
    # (layout) -> the directories its releases' prefixes live in (pruned only there)
    release_dirs: Callable[[NodeLayout], list[str]]
    # (layout) -> the link a rollback moves to the release's prefix, None when there is none
    current_link: Callable[[NodeLayout], str | None] = lambda lay: None
    commands: tuple[str, ...] = ()  # `servefleet` sub-commands: modules of its package
    package: str = ""  # its Python package (set from the declaring module's __name__)


@dataclass(frozen=True)
class NodeClass:
    """A kind of machine. Its hardware facts are data: group_data/<name>.py, hardware only."""

    name: str  # inventory group and data file, and the role fleet.yml names
    title: str
    engine: str | None  # the engine its nodes serve with unless fleet.yml names another
    store: bool = False  # keeps the fleet's model store (the depot): its account and directory
    deploy: str | None = None  # a deploy of its own (the depot's), acting on its nodes only
