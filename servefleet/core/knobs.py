"""What a knob declaration is: its name, its check, who reads it, whether it changes what serves.

The shared knobs are declared in servefleet.fleet.contract, an engine's own in its package
(servefleet/engines/<name>/logic); the contract puts them together. Readers are named by label:
the generic deploys and verbs below, and two stand-ins the contract resolves through the engine
registry, so that no knob spells an engine's deploy:

    SERVE   every engine's deploy (the serving recipes)
    ENGINE  the deploy of the engine that declares the knob
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.core import validate as c

# Deploys (deploys/<label>.py) and verbs that read data of their own.
BASE, DEPOT, MODEL = "base", "depot", "model"
BENCH, REBUILD, ROLLOUT, ROLLBACK = "bench", "rebuild", "rollout", "rollback"
GENERIC_DEPLOYS = (BASE, DEPOT, MODEL, ROLLBACK)
SERVE, ENGINE = "<serving deploys>", "<the engine's deploy>"

FLEET, OPERATIONAL, TESTBED = "fleet", "operational", "testbed"


@dataclass(frozen=True)
class Knob:
    name: str
    check: c.Check
    recipes: tuple[str, ...]
    serving: bool = False  # changes what serves: part of a release's data digest
    scope: str = FLEET  # fleet | operational (set by a verb) | testbed (testbed hosts only)
    required_by: tuple[str, ...] = ()  # recipes for which None is not a value
    # Its default depends on the engine (a port, the model): every engine's data file sets it,
    # all.py and the node classes' files never do (tests/unit/test_contract.py).
    per_engine: bool = False
