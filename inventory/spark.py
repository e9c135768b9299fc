# DGX Spark nodes of the fleet (inventory/fleet.yml, role: spark) -> pyinfra group `spark`.
# Every host's data is validated here, before pyinfra connects anywhere.
from servefleet.fleet.inventory import fleet_groups

(spark,) = fleet_groups(__file__, ["spark"])
