# RTX 4090 nodes of the fleet (inventory/fleet.yml, role: rtx4090) -> pyinfra group `rtx4090`.
from servefleet.inventory import fleet_path, role_hosts

rtx4090 = role_hosts(fleet_path(), "rtx4090")
