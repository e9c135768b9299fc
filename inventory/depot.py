# Model depots of the fleet (inventory/fleet.yml, role: depot) -> pyinfra group `depot`.
# Every host's data is validated here, before pyinfra connects anywhere.
from servefleet.fleet.inventory import fleet_groups

globals().update(fleet_groups(__file__))
