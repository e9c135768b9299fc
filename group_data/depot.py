# Model depot: downloads and verifies each model once for the fleet; serves nothing.
require_gpu = False  # a depot is a storage host
depot_store = "/opt/servefleet/depot"  # verified copies: {store}/{org}/{name}/{sha}/, refs/{rev}
# Models the depot keeps, once for the fleet: [{"repo_id": "org/name", "revision": "main",
# "include": ["*"]}] (revision and include optional: main, everything).
depot_models = []  # models to download and verify once for the fleet (see above)
