"""A deploy for tests/e2e/test_node_output.py: reads two facts through servefleet.facts.batch
(PROBE_ALONE=1: one by one, with pyinfra's host.get_fact) and prints what each read gave on one
line, `PROBE {json}`. PROBE_CASE=fails: the first fact's command exits 3; bytes: it prints a
byte that is not UTF-8, as `ls` would print such a name."""

import json
import os

from pyinfra import host
from pyinfra.api import FactBase

from servefleet.facts import batch
from servefleet.facts.node import CpuArch


class PrintsBytes(FactBase):
    default = list

    def command(self):
        return "printf 'a\\377b\\n'"

    def process(self, output):
        return list(output)


class Exits(FactBase):
    default = list

    def command(self):
        return "echo printed-before-failing; exit 3"

    def process(self, output):
        return list(output)


first = {"fails": Exits, "bytes": PrintsBytes}[os.environ["PROBE_CASE"]]
if os.environ.get("PROBE_ALONE") == "1":
    got = [host.get_fact(first), host.get_fact(CpuArch)]
else:
    batch.plan(host, [(first, {}), (CpuArch, {})])
    got = [batch.get(host, first), batch.get(host, CpuArch)]
print("PROBE " + json.dumps({"first": got[0], "arch": got[1]}), flush=True)
