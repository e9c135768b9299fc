"""Keeps one testbed guest running: starts systemd-nspawn, restarts it when the guest reboots.

Run as `python -m servefleet_dev.testbed.supervise NAME ROOT -- NSPAWN_ARGS...` in its own session.
SIGTERM shuts the guest down cleanly (nspawn turns it into a poweroff) and ends the supervisor.
"""

import signal
import subprocess
import sys

from servefleet_dev.testbed import net

REBOOT_EXIT = 133  # systemd-nspawn's exit code when the guest asked for a reboot


def main(argv: list[str]) -> int:
    name, root, _, *nspawn_args = argv
    stopping = False
    child: subprocess.Popen | None = None

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True
        if child and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while True:
        # nsenter, not `ip netns exec`: the latter remounts /sys and hides the cgroups nspawn needs.
        child = subprocess.Popen(
            [
                "nsenter",
                f"--net={net.NETNS_PATH}",
                "systemd-nspawn",
                "-D",
                root,
                "-M",
                name,
                *nspawn_args,
            ],
            stdin=subprocess.DEVNULL,
        )
        rc = child.wait()
        if stopping or rc != REBOOT_EXIT:
            return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
