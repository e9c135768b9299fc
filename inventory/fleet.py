# The whole fleet (inventory/fleet.yml): every host, in its node class's group and its engine's,
# validated before connecting.
from servefleet.fleet.inventory import fleet_groups

globals().update(fleet_groups(__file__))
