"""Drift's deep items, the recipes' deep checks: what drift's operations alone do not show, read
with facts.

They run per host after the deploy is loaded, for a serving deploy on a host it acts on: the
deploy names its engine (Engine.deploy) and the host's groups name the host's (fleet.yml's role
and engine), so an engine's checks never run for another deploy, for deploys/base.py, or on a
host of another engine. The engine reads what is its own (Engine.deep_items: versions vs pins
and the patch's hashes, or the build's commit and CMake flags); every engine's unit is diffed
against its rendered template, its model checked at the pinned revision, its service and
release read.
"""

from __future__ import annotations

from pyinfra.facts.files import FileContents, Sha1File

from servefleet.core import drift_items as di
from servefleet.core.layout import NodeLayout
from servefleet.core.models import (
    SHA_RE,
    HubError,
    hub_commit,
    invalid_record_reason,
    operator_token,
)
from servefleet.core.systemd import render_unit
from servefleet.facts import batch
from servefleet.facts.models import ModelRecordFiles, VerifiedModel, record_args
from servefleet.facts.releases import NodeReleases, RunningRelease
from servefleet.facts.systemd import UnitState
from servefleet.fleet import registry
from servefleet.recipes.models import model_dir


def unit_item(host, unit: str, template: str, context: dict) -> di.Item:
    path = NodeLayout.unit_path(unit)
    rendered = render_unit(template, context)
    label = f"{template} rendered for {host.name}"
    if batch.get(host, Sha1File, path=path) == di.sha1_text(rendered):
        return di.item(f"unit {path}", True, label, "same content")
    return di.item(
        f"unit {path}",
        False,
        label,
        di.unit_diff(rendered, batch.get(host, FileContents, path=path), path),
    )


def model_item(host, data, include: list[str], dest: str) -> di.Item:
    repo, revision = data["model_repo"], data["model_revision"]
    args = record_args(data, dest)
    record = batch.get(host, VerifiedModel, **args)
    why = "" if record else invalid_record_reason(*batch.get(host, ModelRecordFiles, **args))
    resolved = None
    if not SHA_RE.fullmatch(revision) and data.get("model_source", "hub") == "hub":
        try:  # the same call as the fetch operation's: answered from its cache, no request
            resolved = hub_commit(
                data["hf_endpoint"],
                repo,
                revision,
                operator_token(data, host.name),
                data["hub_timeout_seconds"],
            ).sha
        except HubError:
            resolved = None  # the fetch operation reports it
    return di.model_item(repo, revision, include, dest, record, resolved, why)


def service_and_release(host, data, unit: str) -> list[di.Item]:
    st = batch.get(host, UnitState, unit=unit)
    items = di.service_items(
        unit, data["service_state"], data["service_enabled"], st["active"], st["enabled"]
    )
    lay = NodeLayout.of(data)
    records = batch.get(host, NodeReleases, path=lay.releases_file)
    running = batch.get(host, RunningRelease, path=lay.running_file)
    return items + di.release_items(records, running, data["service_state"] == "running")


def deep_items(host, recipe: str | None) -> list[di.Item]:
    """The deep items of a host whose engine this deploy serves (deploys/<recipe>.py acts on
    it: servefleet.fleet.registry.applies, from the host's groups): the engine's own, the unit
    against the rendered template, the model, the service and the release. [] for any other
    deploy or host."""
    engine = registry.engine_of_deploy(recipe)
    if engine is None or not registry.applies(recipe, host.groups):
        return []
    data = host.data.dict()
    model = model_dir(data["model_repo"], data["model_revision"])
    items = engine.deep_items(host, data, model)
    context = engine.unit_context(host, data, model)
    items.append(unit_item(host, engine.unit, engine.template, context))
    items.append(model_item(host, data, engine.model_include(data), model))
    return items + service_and_release(host, data, engine.unit)
