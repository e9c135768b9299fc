# Run on a real GPU host through `pyinfra -y @local tests/device/facts_probe.py` (the lent H200):
# reads every preflight fact with servefleet's own parsers and writes them to $OUT/facts.json,
# then runs the preflight operation as the Spark recipe would (require_gpu, driver >= 580).
import dataclasses
import json
import os

from pyinfra import host

from servefleet.facts import node as facts
from servefleet.operations import node

found = {
    "os": host.get_fact(facts.OsRelease),
    "arch": host.get_fact(facts.CpuArch),
    "memory": host.get_fact(facts.MemoryBytes),
    "free_disk_tmp": host.get_fact(facts.FreeDiskBytes, path="/tmp/servefleet-probe"),
    "gpus": [dataclasses.asdict(g) for g in host.get_fact(facts.NvidiaGpus)],
}
with open(os.path.join(os.environ.get("OUT", "/tmp"), "facts.json"), "w") as fh:
    json.dump(found, fh, indent=2)
print(json.dumps(found, indent=2))

node.preflight(
    name="Preflight as the GPU recipes run it",
    data={
        "require_gpu": True,
        "min_driver_version": 580,
        "expected_arch": None,
        "min_free_disk_bytes": 1024**3,
        "servefleet_root": "/tmp/servefleet-probe",
    },
)
