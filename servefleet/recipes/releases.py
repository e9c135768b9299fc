"""The last step of every serving recipe: record the node's release (servefleet.core.releases);
and the rollback that serves the previous one again."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host
from pyinfra.api.operation import OperationMeta

from servefleet.core.declarations import Engine
from servefleet.core.layout import UNIT_DIR, NodeLayout
from servefleet.core.releases import Release
from servefleet.core.systemd import render_unit
from servefleet.engines import ENGINES
from servefleet.facts import batch
from servefleet.facts.models import VerifiedModel, record_args
from servefleet.fleet.data import serving_digest
from servefleet.operations import releases as release_ops
from servefleet.recipes import base
from servefleet.recipes.steps import deploy


def build(
    engine: Engine,
    version: str,
    prefix: str,
    unit: str,
    template: str,
    context: dict,
    model_dir: str,
    gate: dict,
    probe_argv: list[str],
    commit: str | None = None,
) -> Callable[[], Release]:
    """() -> Release, read when the record operation runs (the model's sha from its record).
    gate: the release's health check (a rollout gates it, after a rollback too).
    probe_argv: the unit's sandbox probe (a rollback to this release runs it first)."""
    data = base.data()

    def release() -> Release:
        record = batch.get(host, VerifiedModel, **record_args(host.data, model_dir)) or {}
        return Release(
            engine=engine.label,
            version=version,
            prefix=prefix,
            unit=unit,
            unit_text=render_unit(template, context),
            model_repo=data["model_repo"],
            model_revision=data["model_revision"],
            model_sha=record.get("sha"),
            model_dir=model_dir,
            data_digest=serving_digest(data),
            commit=commit,
            gate=gate,
            probe_argv=tuple(probe_argv),
        )

    return release


@deploy("Release")
def record(release_of: Callable[[], Release]) -> OperationMeta:
    """The node's current release, recorded; directories of releases beyond releases_keep go."""
    lay: NodeLayout = base.layout()
    return release_ops.record(
        name="Record the release",
        releases_file=lay.releases_file,
        release=release_of,
        keep=host.data.releases_keep,
        bounds=[*(d for e in ENGINES for d in e.release_dirs(lay)), lay.models_dir],
    )


@deploy("Rollback")
def rollback(force_previous: bool):
    """Serve the previous release again: its unit, build and model are on the node (kept by
    releases_keep); nothing is downloaded or built. The caller checks health afterwards."""
    lay: NodeLayout = base.layout()
    release_ops.rollback(
        name="Serve the previous release",
        releases_file=lay.releases_file,
        running_file=lay.running_file,
        unit_dir=UNIT_DIR,
        links={e.label: link for e in ENGINES if (link := e.current_link(lay))},
        force_previous=force_previous,
    )
