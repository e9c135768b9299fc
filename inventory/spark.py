# DGX Spark nodes of the fleet (inventory/fleet.yml, role: spark) -> pyinfra group `spark` and each
# host's engine (its class's, or the one fleet.yml's `engine:` names).
# Every host's data is validated here, before pyinfra connects anywhere.
from servefleet.fleet.inventory import fleet_groups

globals().update(fleet_groups(__file__))
