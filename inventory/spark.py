# DGX Spark nodes of the fleet (inventory/fleet.yml, role: spark) -> pyinfra group `spark`.
from servefleet.inventory import fleet_path, role_hosts

spark = role_hosts(fleet_path(), "spark")
