# One model on each host, from data: base, then fetch + verify (hub) or copy + verify (depot).
#   pyinfra inventory/testbed.py deploys/model.py --data model_repo=org/name
#   [--data model_revision=<sha>] [--data 'model_include=["*.json","*.safetensors"]']
#   [--data model_source=depot --data depot_host=depot-1]
from pyinfra import host

from servefleet.recipes import base, models

if base.begin("model"):  # data checked: model_repo is required here
    base.node_base()
    models.ensure_model(  # no-op when the revision's directory already holds it, verified
        repo_id=host.data.model_repo,
        revision=host.data.model_revision,
        include=host.data.model_include,
    )
