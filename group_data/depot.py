# Node class model depot: downloads and verifies each model once for the fleet; serves nothing
# (no engine). The hardware only; what it keeps: depot_store and depot_models in all.py.
require_gpu = False  # a depot is a storage host
