# Model depots of the fleet (inventory/fleet.yml, role: depot) -> pyinfra group `depot`.
from servefleet.inventory import fleet_path, role_hosts

depot = role_hosts(fleet_path(), "depot")
