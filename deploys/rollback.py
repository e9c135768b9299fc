# Serve the last healthy release again (`servefleet rollback`, and a rollout's failed hosts):
# its unit, build and model are kept on the node, so nothing is downloaded or built.
#   servefleet rollback inventory/fleet.py --limit NODE       (previous_release=true)
from pyinfra import host

from servefleet.recipes import base, releases

if base.begin("rollback"):  # data checked
    # unit, `current`, restart, records; with no release to go back to, this host fails
    releases.rollback(force_previous=bool(host.data.get("previous_release")))
