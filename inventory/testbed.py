# The local testbed's hosts (`servefleet testbed up`), grouped by role, read from its state.
# The file-name group `testbed` comes last, so group_data/testbed.py overrides the role files.
from servefleet.testbed.inventory import role_hosts

spark = role_hosts("spark")
rtx4090 = role_hosts("rtx4090")
depot = role_hosts("depot")
