# Model depot: downloads and verifies each model once for the fleet; serves nothing.
require_gpu = False  # a depot is a storage host
# depot_store and depot_models: group_data/all.py (None: {servefleet_root}/depot; []).
