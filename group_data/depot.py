# Model depot: downloads and verifies each model once for the fleet; serves nothing.
require_gpu = False  # a depot is a storage host
