# Remove what servefleet installed on a node (used by `servefleet rebuild`): services, venvs,
# builds, state and release records. The models (and a depot's store) are kept unless
# purge_models = True (`servefleet rebuild --purge-models`).
from pyinfra import host

from servefleet.recipes import base, teardown

if base.begin("base"):
    base.check_own_dirs()  # nothing is stopped or deleted where the root is not servefleet's
    teardown.remove_services()
    teardown.remove_tree(purge_models=bool(host.data.purge_models))
