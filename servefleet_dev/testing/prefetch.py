"""Make, in the background, what the unit tier needs and the e2e tier leaves idle time for.

    python -m servefleet_dev.testing.prefetch

Started by tests/conftest.py when a session runs the e2e tier first: while the testbed's first
tests wait on apt, pip and health checks, this builds the llama.cpp sources the guests build
later or the unit tier needs (the recipe's build.sh into the guests' ccache: whoever comes
second compiles from the cache) and the vLLM loader venv (downloads). Each step takes the same
lock its test-side caller takes, so nothing is made twice. Nice'd: the tests come first.
"""

from __future__ import annotations

import sys
import time

from servefleet_dev.testbed import toolchain
from servefleet_dev.testbed.platforms import RELEASES
from servefleet_dev.testing.llama_build import llama_host_build
from servefleet_dev.testing.llama_src import RELEASE_TAG
from servefleet_dev.testing.wheels import vllm_venv

# The testbed's pin (b9785) first: the e2e tier's rtx4090 material waits for it (testbed.material
# .pin_in_ccache, same lock), then the guests compile it from the cache. The rollout's upgrade
# (b9785-patch1) changes no compiled code: the guests build it from the same cache.
# Then the pin with the toolchain of each Debian release the testbed runs whose compiler is
# not this machine's (Debian 13's gcc 14 on a Debian 12 machine: testbed.toolchain): a guest of
# that release (tests/e2e/test_debian13.py) would otherwise compile it cold on the critical
# path; its material waits on the same lock. After the loader venv, which the unit tier needs.
STEPS = (
    (f"llama.cpp {RELEASE_TAG}", lambda: llama_host_build(tag=RELEASE_TAG)),
    ("vLLM 0.24.0 loader venv", lambda: vllm_venv("0.24.0")),
    *(
        (
            f"llama.cpp {RELEASE_TAG}, {release}'s toolchain",
            lambda release=release: toolchain.pin_in_ccache(release, log=lambda m: None),
        )
        for release in RELEASES
        if toolchain.needs_own_toolchain(release)
    ),
)


def main() -> int:
    for name, step in STEPS:
        started = time.monotonic()
        try:
            step()
        except Exception as exc:  # noqa: BLE001 (the test that needs it reports it properly)
            print(f"prefetch: {name}: {exc}", flush=True)
            continue
        print(f"prefetch: {name} ready in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
