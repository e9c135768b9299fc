# The model depot: downloads and verifies each model of depot_models once for the whole fleet;
# nodes with model_source = "depot" copy from it (read-only rsync over SSH).
#   pyinfra inventory/fleet.py deploys/depot.py --limit depot
from pyinfra import local

from servefleet import base, depot

if base.for_role("depot", "depot"):  # hosts of other roles: a visible no-op
    local.include("deploys/base.py")  # preflight, packages, service user and tree, tools venv

    depot.validate_data()  # depot_store, depot_models and the model keys; stops the run if bad
    depot.serve()  # read-only rsync account for the fleet key, then each model fetched + verified
