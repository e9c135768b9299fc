# The model depot: downloads and verifies each model of depot_models once for the whole fleet;
# nodes with model_source = "depot" copy from it (read-only rsync over SSH).
#   pyinfra inventory/fleet.py deploys/depot.py --limit depot
from servefleet.recipes import base, depot

if base.begin("depot"):  # data checked; hosts of other roles: a visible no-op
    base.node_base()  # preflight, packages, account and tree, tools venv
    depot.serve()  # read-only rsync account for the fleet key, then each model fetched + verified
