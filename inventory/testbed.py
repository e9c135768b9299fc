# The local testbed's hosts (`servefleet testbed up`), grouped by role, read from its state and
# validated before anything connects. Group data applies in definition order, then the
# file-name group `testbed` last:
#   group_data/<role>.py  <  group_data/testbed_<role>.py  <  group_data/testbed.py
from servefleet_dev.testbed.inventory import testbed_groups

spark, rtx4090, depot, testbed_spark, testbed_rtx4090, testbed_depot = testbed_groups(__file__)
