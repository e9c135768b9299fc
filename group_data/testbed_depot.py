# Testbed-only values for depot hosts (after group_data/depot.py, before group_data/testbed.py).
download_margin_bytes = 64 * 1024**2  # guests share the host's disk: keep the margin small
