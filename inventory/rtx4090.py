# RTX 4090 nodes of the fleet (inventory/fleet.yml, role: rtx4090) -> pyinfra group `rtx4090`.
# Every host's data is validated here, before pyinfra connects anywhere.
from servefleet.fleet.inventory import fleet_groups

(rtx4090,) = fleet_groups(__file__, ["rtx4090"])
