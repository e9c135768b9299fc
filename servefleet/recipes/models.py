"""Models on nodes: pinned, verified downloads from the hub, or copies from the fleet's depot.

    run = models.ensure_model(repo_id="Qwen/Qwen-AgentWorld-35B-A3B", revision="main",
                              include=["*.json", "*.safetensors"])
    ...  # later, e.g. a restart: depends_on=[run]

The directory is the layout's, one per repo and commit ({models_root}/<org>--<name>/<sha>): the
revision is resolved to its commit first, so what a previous release serves stays on disk when a
branch moves, and can be served again. How it works: the operator side
resolves the revision to a commit sha with the hub's API (or asks the depot); on the node,
files/model/fetch_model.py, run as the service user, checks free disk, fetches, verifies size
and sha256 of every file, and only then writes {dest}/.servefleet/verified.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import File

from servefleet.core.fleetkey import fleet_key
from servefleet.core.layout import NodeLayout
from servefleet.core.models import FROM_STORE, SHA_RE, HubError, hub_commit, operator_token
from servefleet.facts.models import VerifiedModel, record_args
from servefleet.facts.pyenv import DistVersions
from servefleet.operations import depot as depot_ops, files, models as model_ops
from servefleet.recipes import base
from servefleet.recipes.steps import deploy

FETCHER = "files/model/fetch_model.py"


@dataclass
class ModelRun:
    """What ensure_model did on this host; read at execution time (`did_change`)."""

    fetch: OperationMeta  # the fetch-and-verify operation
    path: str  # the model directory

    def did_change(self) -> bool:
        """True when this run fetched, replaced or removed files of the model."""
        return self.fetch.did_change()


UNRESOLVED = "unresolved"  # a revision the hub or depot could not resolve: the fetch fails


def resolve(repo_id: str, revision: str) -> str | None:
    """The commit sha `revision` designates now: itself when pinned, else the hub's answer (one
    request per repo and revision per run) or the depot's record. None when neither answers;
    the fetch operation then fails this host with the reason."""
    if SHA_RE.fullmatch(revision):
        return revision
    if host.data.model_source == FROM_STORE:
        return depot_ops.ref_on_depot(depot_ops.locate(host.data.depot_host), repo_id, revision)
    try:
        return hub_commit(
            host.data.hf_endpoint,
            repo_id,
            revision,
            operator_token(host.data, host.name),
            host.data.hub_timeout_seconds,
        ).sha
    except HubError:
        return None


def model_dir(repo_id: str, revision: str) -> str:
    """This host's directory of repo_id at revision (resolved to its commit)."""
    return base.layout().model_dir(repo_id, resolve(repo_id, revision) or UNRESOLVED)


def model_reads(dest: str) -> list:
    """What the model steps read on the node for a model in `dest` (servefleet.facts.batch):
    the fetcher (uploaded), the hub client in the tools venv or the depot's key, the token, the
    verified record."""
    lay = base.layout()
    reads = [
        *base.upload_reads(lay.bin("servefleet-fetch-model")),
        (VerifiedModel, record_args(host.data, dest)),
    ]
    reads.append((File, {"path": lay.hf_token_file}))
    if host.data.model_source == "hub":
        reads += [
            (DistVersions, {"venv": lay.tools_venv, "names": tuple(base.MODEL_TOOLS)}),
            (File, {"path": lay.depot_key}),
            (File, {"path": lay.depot_known_hosts}),
        ]
    return reads


def _once(step: str) -> bool:
    """True the first time a host asks for step in this run, however many models it gets."""
    done = host.state.__dict__.setdefault("_servefleet_model_steps", set())
    if (host.name, step) in done:
        return False
    done.add((host.name, step))
    return True


@deploy("Model tools")
def model_tools(source: str):
    """The fetcher, the hub client and token (hub) or the depot's key and host key (depot)."""
    lay = base.layout()
    files.upload(
        name="Model fetch/verify script",
        dest=lay.bin("servefleet-fetch-model"),
        content=open(FETCHER, "rb").read(),
        mode="755",
    )
    if source == "hub":
        base.tools(base.MODEL_TOOLS)
        token = operator_token(host.data, host.name)
        if token:
            files.upload(
                name="Hub token (0400, the fetching service user's)",
                dest=lay.hf_token_file,
                content=token + "\n",
                owner=host.data.servefleet_user,
                group="root",
                mode="400",
                secret=True,
            )
        else:
            files.absent(name="No hub token (anonymous)", path=lay.hf_token_file)
        # A node switched from the depot keeps no fleet key it no longer uses.
        for path in (lay.depot_key, lay.depot_known_hosts):
            files.absent(name=f"No fleet key material {path} (hub source)", path=path)
    else:
        files.absent(name="No hub token (model store source)", path=lay.hf_token_file)
        depot_ops.locate(host.data.depot_host)  # a bad depot_host stops the run here
        private, _ = fleet_key(host.data, host.name)
        files.upload(
            name="Fleet key for the model store (0600)",
            dest=lay.depot_key,
            content=private,
            owner=host.data.servefleet_user,
            group="root",
            mode="400",
            secret=True,
        )
        depot_ops.known_hosts(
            name="Model store's host key (known_hosts)",
            path=lay.depot_known_hosts,
            depot_host=host.data.depot_host,
        )


def fetch_args(lay: NodeLayout, source: str) -> dict:
    """Everything fetch needs besides the model itself, from the layout and data."""
    token = operator_token(host.data, host.name) if source == "hub" else None
    return {
        "fetcher": lay.bin("servefleet-fetch-model"),
        "python": lay.tools_python,
        "root": lay.models_dir,
        "user": host.data.servefleet_user,
        "margin_bytes": host.data.download_margin_bytes,
        "hf": lay.tools_bin("hf"),
        "hf_home": lay.hf_home,
        "token_file": lay.hf_token_file if token else None,
        "depot_host": host.data.get("depot_host"),
        "depot_key": lay.depot_key,
        "depot_known_hosts": lay.depot_known_hosts,
        "bwlimit_kib": host.data.get("depot_bwlimit_kib"),
    }


@deploy("Model")
def ensure_model(repo_id: str, revision: str, include: list[str]) -> ModelRun:
    """
    Put repo_id at revision into its layout directory, verified, from the hub or the depot.

    + repo_id: hub repo id, e.g. ``Qwen/Qwen-AgentWorld-35B-A3B``
    + revision: branch, tag or 40-hex commit sha (``main`` follows the branch; a sha pins it)
    + include: glob patterns of the files to fetch, e.g. ``["*.json", "*.safetensors"]``

    ``host.data.model_source`` picks the source: ``hub`` (``hf_endpoint``, token from
    ``hf_token_file`` or ``$HF_TOKEN``) or ``depot`` (rsync from ``depot_host``).
    """
    lay, source = base.layout(), host.data.model_source
    if _once(f"tools-{source}"):
        model_tools(source)
    dest = model_dir(repo_id, revision)
    fetch = model_ops.fetch(
        name=f"{repo_id}@{revision}: fetch and verify ({source})",
        repo_id=repo_id,
        revision=revision,
        include=list(include),
        dest=dest,
        source=source,
        request_file=lay.fetch_request(dest),
        record_file=lay.model_record(dest),
        **fetch_args(lay, source),
    )
    return ModelRun(fetch=fetch, path=dest)
