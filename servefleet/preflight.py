"""Preflight rules: pure functions from facts + recipe data to a list of problems."""

from servefleet.facts import Gpu


def node_problems(*, arch: str, gpus: list[Gpu], free_disk: int, data: dict) -> list[str]:
    """What makes this node unfit for its recipe; [] when it is fit."""
    problems = []
    expected = data.get("expected_arch")
    if expected and arch != expected:
        problems.append(f"CPU architecture is {arch}, the recipe is built for {expected}")
    if data.get("require_gpu"):
        if not gpus:
            problems.append("no NVIDIA GPU found (nvidia-smi missing or lists none); install the "
                            "driver, or set require_gpu = False for a host without one")
        else:
            minimum = data.get("min_driver_version")
            old = [g for g in gpus if g.driver_major < minimum]
            if old:
                problems.append(f"NVIDIA driver {old[0].driver_version} is older than the "
                                f"recipe's minimum {minimum}; upgrade the driver")
    need = data.get("min_free_disk_bytes") or 0
    if free_disk < need:
        problems.append(f"{free_disk / 1024**3:.1f} GiB free under {data.get('servefleet_root')}, "
                        f"need {need / 1024**3:.1f} GiB")
    return problems


def usable_memory(data: dict, memory: dict, gpus: list[Gpu]) -> int:
    """Memory the engine may plan with: data wins; else the GPU's memory; else system memory.

    On GB10 (unified memory) nvidia-smi reports no GPU memory, so system memory is used there.
    """
    if data.get("usable_memory_bytes"):
        return data["usable_memory_bytes"]
    sized = [g.memory_bytes for g in gpus if g.memory_bytes]
    return min(sized) if sized else memory["total"]
