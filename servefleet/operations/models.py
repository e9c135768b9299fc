"""Models on a node: fetch repo@revision into its directory and verify it, unless already there.

The node side is files/model/fetch_model.py, run as the service user with the tools venv's
python; this operation decides whether it must run and writes its request.
"""

from __future__ import annotations

import json
import posixpath
import shlex

from pyinfra import host
from pyinfra.api import operation

from servefleet.core.knobs import DEPOT
from servefleet.core.models import (
    FROM_STORE,
    SHA_RE,
    HubError,
    hub_commit,
    operator_token,
    satisfies,
)
from servefleet.facts import batch
from servefleet.facts.depot import DepotRef
from servefleet.facts.models import VerifiedModel
from servefleet.operations.depot import locate, ref_on_depot
from servefleet.operations.files import upload
from servefleet.operations.node import fail_host


@operation()
def fetch(
    repo_id: str,
    revision: str,
    include: list[str],
    dest: str,
    source: str,
    request_file: str,
    record_file: str,
    fetcher: str,
    python: str,
    user: str,
    margin_bytes: int,
    root: str,
    hf: str | None = None,
    hf_home: str | None = None,
    token_file: str | None = None,
    depot_host: str | None = None,
    depot_key: str | None = None,
    depot_known_hosts: str | None = None,
    bwlimit_kib: int | None = None,
):
    """
    Fetch repo_id at revision into dest and verify every file; a no-op when dest already holds it.

    + repo_id: hub repo id, e.g. ``org/name``
    + revision: branch, tag or 40-hex commit sha
    + include: glob patterns of the files to fetch
    + dest: the model directory (must exist, owned by the service user)
    + source: ``hub`` (hf_endpoint) or ``depot`` (rsync from depot_host's verified copy)
    + request_file, fetcher, python: the request written for, the script and the interpreter
    + record_file: root's record that dest is complete and verified (NodeLayout.model_record),
      written from what the fetcher reports on a descriptor root opened: never inside dest
    + user: the service user the fetcher runs as
    + margin_bytes: free disk required beyond the download
    + root: the directory dest must be inside (the models root, the depot store): the fetcher
      refuses a dest outside it and writes or deletes nothing outside dest
    + hf, hf_home, token_file: hub source: the hf CLI, its home, the token file on the node
    + depot_host, depot_key, depot_known_hosts, bwlimit_kib: depot source

    "Already there" is read from record_file (the VerifiedModel fact): same repo, commit sha and
    include patterns, every file at its recorded size and no other file in dest. Otherwise the
    node-side script checks free disk (fails before fetching a byte), removes what is not part
    of the model, fetches, verifies sha256 and reports the record; a corrupt file fails this
    host, named, and is fetched again next run.

    **Example:** servefleet.recipes.models.ensure_model fills every argument from data.
    """
    record = batch.get(host, VerifiedModel, path=dest, record=record_file, user=user)
    pinned = bool(SHA_RE.fullmatch(revision))
    if record and pinned and satisfies(record, repo_id, revision, include):
        host.noop(f"{repo_id}@{revision[:12]} is verified in {dest}")
        return

    request = {
        "source": source,
        "repo_id": repo_id,
        "revision": revision,
        "include": list(include),
        "dest": dest,
        "root": root,
        "margin_bytes": margin_bytes,
        "record_fd": 3,
    }
    if source == FROM_STORE:
        where = locate(depot_host)
        sha = revision if pinned else ref_on_depot(where, repo_id, revision)
        if sha is None:
            yield fail_host(
                f"depot_host {where.name} has no verified copy of {repo_id}@{revision}: "
                f"add it to its depot_models and run deploys/{DEPOT}.py"
            )
            return
        if satisfies(record, repo_id, sha, include):
            host.noop(f"{repo_id}@{sha[:12]} is verified in {dest} (from {where.name})")
            return
        request.update(
            sha=sha,
            depot={
                "host": where.address,
                "port": where.port,
                "user": where.user,
                "path": where.layout.depot_rsync_path(repo_id, sha),
                "key": depot_key,
                "known_hosts": depot_known_hosts,
                "bwlimit_kib": bwlimit_kib,
            },
        )
    else:
        endpoint = host.data.hf_endpoint
        try:
            commit = hub_commit(
                endpoint,
                repo_id,
                revision,
                operator_token(host.data, host.name),
                host.data.hub_timeout_seconds,
            )
        except HubError as exc:
            yield fail_host(str(exc))
            return
        if satisfies(record, repo_id, commit.sha, include):
            host.noop(f"{repo_id}@{revision} ({commit.sha[:12]}) is verified in {dest}")
            return
        selected = commit.select(include)
        if not selected:
            yield fail_host(f"no file of {repo_id}@{commit.sha[:12]} matches include {include}")
            return
        request.update(
            sha=commit.sha,
            endpoint=endpoint,
            files=[f.to_json() for f in selected],
            hf=hf,
            hf_home=hf_home,
            token_file=token_file,
        )

    yield from upload._inner(
        dest=request_file, content=json.dumps(request, indent=1, sort_keys=True), mode="644"
    )
    yield fetch_command(user, python, fetcher, request_file, record_file)


def fetch_command(user: str, python: str, fetcher: str, request_file: str, record_file: str) -> str:
    """Drop the record (not ready until verified), run the fetcher as user with descriptor 3 on
    a root-owned file in state/, and make that the record only when the fetcher succeeded."""
    q = shlex.quote
    tmp = f"{record_file}.tmp"
    return (
        f"rm -f {q(record_file)} {q(tmp)} && install -d -m 755 {q(posixpath.dirname(record_file))}"
        f" && (umask 022 && runuser -u {q(user)} -- {q(python)} -I {q(fetcher)} {q(request_file)}"
        f" 3>{q(tmp)}) && mv -f {q(tmp)} {q(record_file)} || {{ rm -f {q(tmp)}; exit 1; }}"
    )


@operation()
def depot_copy(
    repo_id: str, revision: str, include: list[str], dest_of, ref_file: str, fetch_args: dict
):
    """
    On the depot: one verified copy of repo_id at revision in the store, and its ref.

    + repo_id, revision, include: as ``fetch``
    + dest_of: sha -> the copy's directory (NodeLayout.depot_model_dir)
    + ref_file: the file that names the sha of this revision (NodeLayout.depot_ref), root's
    + fetch_args: the rest of ``fetch``'s arguments (request_file excepted: it follows dest)

    **Example:** servefleet.recipes.depot.serve fills every argument from data.
    """
    try:
        commit = hub_commit(
            host.data.hf_endpoint,
            repo_id,
            revision,
            operator_token(host.data, host.name),
            host.data.hub_timeout_seconds,
        )
    except HubError as exc:
        yield fail_host(str(exc))
        return
    args = dict(fetch_args)
    request_of = args.pop("request_of")
    dest = dest_of(commit.sha)
    record_of = args.pop("record_of")
    yield from fetch._inner(
        repo_id=repo_id,
        revision=revision,
        include=include,
        dest=dest,
        source="hub",
        request_file=request_of(dest),
        record_file=record_of(dest),
        **args,
    )
    if batch.get(host, DepotRef, ref_file=ref_file) != commit.sha:
        # After the fetch command: a failed verification stops the host before the ref moves.
        yield from upload._inner(dest=ref_file, content=commit.sha + "\n", mode="644")
