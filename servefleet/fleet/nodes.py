"""The node classes, declared and listed once: the kinds of machine servefleet provisions.

A class's hardware facts are data, in its own file (group_data/<name>.py: architecture, GPU
architecture for builds, memory model, driver and disk floors, the roofline bench uses). A role
in the inventory is a class with an engine (its default one unless fleet.yml names another); the
depot is a class without one (docs/nodes.md, docs/engines.md).
"""

from __future__ import annotations

from servefleet.core.declarations import NodeClass
from servefleet.core.knobs import DEPOT

SPARK = NodeClass("spark", "DGX Spark (GB10)", "vllm")
RTX4090 = NodeClass("rtx4090", "RTX 4090", "llamacpp")
DEPOT_CLASS = NodeClass("depot", "model depot", None, store=True, deploy=DEPOT)

NODE_CLASSES: tuple[NodeClass, ...] = (SPARK, RTX4090, DEPOT_CLASS)
