# The whole fleet (inventory/fleet.yml): every host, grouped by role, validated before connecting.
from servefleet.fleet.inventory import fleet_groups

spark, rtx4090, depot = fleet_groups(__file__, ["spark", "rtx4090", "depot"])
