"""The values group_data/*.py give, applied in order as pyinfra applies them to a host."""

import runpy

from servefleet.paths import REPO_ROOT


def load(*names: str) -> dict:
    """load("all", "spark", "testbed_spark", "testbed"): a testbed spark host's group data."""
    data = {}
    for name in names:
        values = runpy.run_path(str(REPO_ROOT / "group_data" / f"{name}.py"))
        data.update({k: v for k, v in values.items() if not k.startswith("__")})
    return data
