# The local testbed's hosts (`servefleet testbed up`), read from its state and validated before
# anything connects. A host's role is its name's prefix: a node class (spark-1: its own engine)
# or a class and an engine (spark-llamacpp-1). Group data applies in this order, then the
# file-name group `testbed` last:
#   <class>.py  <  <engine>.py  <  testbed_<class>.py  <  testbed_<engine>.py  <  testbed.py
from servefleet_dev.testbed.inventory import testbed_groups

globals().update(testbed_groups(__file__))
