# RTX 4090 nodes of the fleet (inventory/fleet.yml, role: rtx4090) -> pyinfra group `rtx4090` and each
# host's engine (its class's, or the one fleet.yml's `engine:` names).
# Every host's data is validated here, before pyinfra connects anywhere.
from servefleet.fleet.inventory import fleet_groups

globals().update(fleet_groups(__file__))
