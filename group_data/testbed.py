# The local testbed (servefleet testbed up): real Debian hosts (12, or 13 when the name asks:
# NAME@trixie) without GPUs. This file-name group is applied after the node class's, the
# engine's and the testbed_*.py files, so these values override them for testbed hosts only.
require_gpu = False  # no GPUs in systemd-nspawn guests
min_free_disk_bytes = 1 * 1024**3  # guests share the host's disk
model_min_free_disk_bytes = 0  # the tiny models need nothing beyond it
# Host-side caches bind-mounted into every guest (servefleet_dev/testbed/state.py, shared_dir).
pip_find_links = ["/var/cache/servefleet/wheels"]  # the testbed's wheelhouse
