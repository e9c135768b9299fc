"""The sandbox probe: the unit's own sandbox, tried on a short command before a (re)start.

pyinfra inventory/testbed.py servefleet.operations.sandbox.probe ...  (run by the recipes)
"""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand, operation

from servefleet.core import sandbox


@operation(is_idempotent=False)
def probe(unit: str, user: str, properties: list, environment: list, argv: list, gpu: bool):
    """
    Run ``argv`` as ``user`` in a transient unit with the serving unit's sandbox properties;
    fail this host with one line naming what was denied when it does not succeed.

    + unit: the serving unit (the probe runs as ``<unit>-probe``)
    + user: the service user
    + properties: (setting, value) pairs from servefleet.core.sandbox.properties, as the unit
      has them
    + environment: the unit's Environment= words
    + argv: the probe: ``nvidia-smi -L`` / torch initialising CUDA on a GPU node, the engine's
      ``--version`` without one
    + gpu: make the NVIDIA device nodes first (root, outside the sandbox), as the unit does

    Run it only when a restart follows (``_if=``): it changes nothing on the node.

    **Example:**

    .. code:: python

        sandbox.probe(unit="servefleet-llama.service", user="servefleet",
                      properties=sandbox_props, environment=[], argv=["nvidia-smi", "-L"],
                      gpu=True, _if=restart_follows)
    """
    script = sandbox.probe_script(unit, user, properties, environment, argv, gpu)
    yield StringCommand("sh", "-c", shlex.quote(script))
