# One model on each host, from data: base, then fetch + verify (hub) or copy + verify (depot).
#   pyinfra inventory/testbed.py deploys/model.py --data model_repo=org/name
#   [--data model_revision=<sha>] [--data 'model_include=["*.json","*.safetensors"]']
#   [--data model_source=depot --data depot_host=depot-1]
from pyinfra import host, local

from servefleet import models

local.include("deploys/base.py")  # preflight, packages, service user and tree, tools venv

models.validate_data(extra=models.MODEL_DEPLOY_KEYS)  # bad data stops the whole run here
models.ensure_model(  # no-op when {dest}/.servefleet/verified.json already holds it
    repo_id=host.data.model_repo,
    revision=host.data.model_revision,
    include=host.data.model_include,
    dest=host.data.model_dir or models.default_dir(host.data, host.data.model_repo),
)
