# The whole fleet (inventory/fleet.yml): every host, grouped by role.
from servefleet.inventory import fleet_path, role_hosts

spark = role_hosts(fleet_path(), "spark")
rtx4090 = role_hosts(fleet_path(), "rtx4090")
depot = role_hosts(fleet_path(), "depot")
