# Remove what servefleet installed on a node (used by `servefleet rebuild`): services, venvs,
# builds, state. The model store is kept unless --data purge_models=true.
from pyinfra import host

from servefleet import teardown

teardown.remove_services()
teardown.remove_tree(purge_models=str(host.data.get("purge_models")).lower() in ("1", "true", "yes"))
