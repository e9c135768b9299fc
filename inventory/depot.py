# Model depots of the fleet (inventory/fleet.yml, role: depot) -> pyinfra group `depot`.
# Every host's data is validated here, before pyinfra connects anywhere.
from servefleet.fleet.inventory import fleet_groups

(depot,) = fleet_groups(__file__, ["depot"])
