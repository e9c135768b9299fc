"""The model operation: fetch repo@revision into a directory and verify it, unless already there.

Run on its own (hub source; the deploy `servefleet.models.ensure_model` adds the tools first)::

    pyinfra inventory/testbed.py servefleet.operations.model.fetch repo_id=org/name \
        revision=main include='["*"]' dest=/opt/servefleet/models/name source=hub
"""

from __future__ import annotations

import json
from io import StringIO

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.operations import files

from servefleet import models
from servefleet.operations.node import fail_host


def request_path(dest: str) -> str:
    slug = dest.strip("/").replace("/", "_") or "root"
    return f"{host.data.servefleet_root}/state/models/{slug}.request.json"


@operation()
def fetch(repo_id: str, revision: str, include: list[str], dest: str, source: str = "hub"):
    """
    Fetch repo_id at revision into dest and verify every file; a no-op when dest already holds it.

    + repo_id: hub repo id, e.g. ``org/name``
    + revision: branch, tag or 40-hex commit sha
    + include: glob patterns of the files to fetch
    + dest: the model directory (must exist, owned by the service user)
    + source: ``hub`` (hf_endpoint) or ``depot`` (rsync from depot_host's verified copy)

    "Already there" is read from ``{dest}/.servefleet/verified.json`` (the VerifiedModel fact):
    same repo, commit sha and include patterns, every file at its recorded size. Otherwise the
    node-side script checks free disk (fails before fetching a byte), fetches, verifies sha256
    and writes that record; a corrupt file fails this host, named, and is fetched again next run.

    **Example:**

    .. code:: python

        model.fetch(repo_id="org/name", revision="main", include=["*"],
                    dest="/opt/servefleet/models/name")
    """
    record = host.get_fact(models.VerifiedModel, path=dest)
    pinned = bool(models.SHA_RE.fullmatch(revision))
    if record and pinned and models.satisfies(record, repo_id, revision, include):
        host.noop(f"{repo_id}@{revision[:12]} is verified in {dest}")
        return

    request = {
        "source": source, "repo_id": repo_id, "revision": revision, "include": list(include),
        "dest": dest, "margin_bytes": host.data.download_margin_bytes,
    }
    if source == "depot":
        from servefleet import depot

        where = depot.locate(host.data.depot_host)
        sha = revision if pinned else depot.ref_on_depot(where, repo_id, revision)
        if sha is None:
            yield fail_host(f"depot {where.name} has no verified copy of {repo_id}@{revision}: "
                            f"add it to depot_models and run deploys/depot.py")
            return
        if models.satisfies(record, repo_id, sha, include):
            host.noop(f"{repo_id}@{sha[:12]} is verified in {dest} (depot {where.name})")
            return
        request.update(sha=sha, depot=depot.request_fields(where, repo_id, sha))
    else:
        endpoint = host.data.hf_endpoint
        try:
            commit = models.hub_commit(endpoint, repo_id, revision,
                                       models.operator_token(host.data),
                                       host.data.hub_timeout_seconds)
        except models.HubError as exc:
            yield fail_host(str(exc))
            return
        if models.satisfies(record, repo_id, commit.sha, include):
            host.noop(f"{repo_id}@{revision} ({commit.sha[:12]}) is verified in {dest}")
            return
        selected = commit.select(include)
        if not selected:
            yield fail_host(f"no file of {repo_id}@{commit.sha[:12]} matches include {include}")
            return
        request.update(
            sha=commit.sha, endpoint=endpoint, files=[f.to_json() for f in selected],
            hf=f"{host.data.servefleet_root}/tools/venv/bin/hf",
            hf_home=f"{host.data.servefleet_root}/state/hf-home",
            token_file=models.token_path() if models.operator_token(host.data) else None,
        )

    user = host.data.servefleet_user
    req_file = request_path(dest)
    yield from files.put._inner(src=StringIO(json.dumps(request, indent=1, sort_keys=True)),
                                dest=req_file, user=user, group=user, mode="644")
    yield StringCommand("runuser", "-u", user, "--", models.tools_python(), models.script_path(),
                        req_file)
