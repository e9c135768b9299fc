"""The model depot (deploys/depot.py): each model of depot_models downloaded and verified once
for the fleet, served read-only over rsync to the nodes with model_source = "depot".

- every model goes to {depot_store}/<org>--<name>/<sha>/ (its .servefleet/verified.json lists
  every file and sha256: the manifest nodes verify against); which sha a revision designates
  is root's record in the state dir, written only after verification;
- a read-only account (`depot_user`) whose only key is the fleet key, forced to
  `rrsync -ro {depot_store}`: it can read the store over rsync and do nothing else.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.operations import files as pyinfra_files

from servefleet.core.fleetkey import depot_models, fleet_key
from servefleet.operations import files, models as model_ops, node
from servefleet.recipes import base
from servefleet.recipes.models import fetch_args, model_tools
from servefleet.recipes.steps import deploy

RRSYNC = "/usr/bin/rrsync"  # rsync >= 3.2.4 ships it (Debian 12, Ubuntu 24.04)


@deploy("Model store read-only account")
def account():
    """depot_user: logs in only with the fleet key, forced to `rrsync -ro {depot_store}`."""
    lay, user = base.layout(), host.data.servefleet_user
    depot_user = host.data.depot_user
    _, public = fleet_key(host.data, host.name)
    pyinfra_files.directory(
        name=f"Model store {lay.depot_dir}", path=lay.depot_dir, user=user, group=user, mode="755"
    )
    base.mark_own_dirs(("depot_store",))
    # A shell, because sshd runs the forced command through it; the key allows nothing else.
    node.account(
        name=f"Model store user {depot_user}", user=depot_user, home=lay.depot_home, shell="/bin/sh"
    )
    for d in (lay.depot_home, f"{lay.depot_home}/.ssh"):  # root's: the account cannot change them
        pyinfra_files.directory(
            name=f"Directory {d}", path=d, user="root", group="root", mode="755"
        )
    line = f'restrict,command="{RRSYNC} -ro {lay.depot_dir}" {public}\n'
    files.upload(
        name="Fleet key, read-only rsync of the store",
        dest=f"{lay.depot_home}/.ssh/authorized_keys",
        content=line,
        mode="644",
    )


@deploy("Model store")
def serve():
    """The depot role: read-only account, then each model of depot_models, once, verified."""
    account()
    models = depot_models(host.data)
    if not models:
        return
    lay = base.layout()
    model_tools("hub")
    args = {
        **fetch_args(lay, "hub"),
        "root": lay.depot_dir,
        "request_of": lay.fetch_request,
        "record_of": lay.model_record,
    }
    for m in models:
        model_ops.depot_copy(
            name=f"Stored copy of {m['repo_id']}@{m['revision']}",
            repo_id=m["repo_id"],
            revision=m["revision"],
            include=m["include"],
            dest_of=lambda sha, repo=m["repo_id"]: lay.depot_model_dir(repo, sha),
            ref_file=lay.depot_ref(m["repo_id"], m["revision"]),
            fetch_args=args,
        )
