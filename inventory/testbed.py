# The local testbed's hosts (`servefleet testbed up`), grouped by role, read from its state.
# Group data applies in definition order, then the file-name group `testbed` last:
#   group_data/<role>.py  <  group_data/testbed_<role>.py  <  group_data/testbed.py
from servefleet.testbed.inventory import role_hosts

spark = role_hosts("spark")
rtx4090 = role_hosts("rtx4090")
depot = role_hosts("depot")

# Testbed-only values per role (e.g. a spark host provisioned but stopped: no GPU here).
testbed_spark = role_hosts("spark")
testbed_rtx4090 = role_hosts("rtx4090")
testbed_depot = role_hosts("depot")
