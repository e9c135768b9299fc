"""Host-side services the guests use (the local hub), recorded in the testbed state."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from servefleet_dev.testbed import net
from servefleet_dev.testbed.state import TestbedState, common_dir, testbed_dir

HUB_PORT = 8090


def hub_root() -> Path:
    path = common_dir() / "shared" / "hub"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # As the server binds (SO_REUSEADDR): a just-stopped hub's TIME_WAIT leaves the port free,
        # so a restarted testbed keeps its hub URL (the hosts' hf_endpoint).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, TypeError):
        return False


def start_all(state: TestbedState, log=print) -> None:
    """The local hub, on the host's testbed address: the guests' upstream for models."""
    hub = state.services.get("hub")
    if hub and _alive(hub.get("pid")):
        return
    port = HUB_PORT
    while not _port_free(net.HOST_ADDR, port):
        port += 1
    with open(testbed_dir() / "hub.log", "ab") as log_file:  # the hub's, not kept here
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servefleet_dev.hub",
                "serve",
                "--root",
                str(hub_root()),
                "--host",
                net.HOST_ADDR,
                "--port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    url = f"http://{net.HOST_ADDR}:{port}"
    deadline = time.monotonic() + 15
    while True:  # ready once it accepts connections
        try:
            socket.create_connection((net.HOST_ADDR, port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the testbed hub did not start; see {testbed_dir()}/hub.log"
                ) from None
            time.sleep(0.05)
    state.services["hub"] = {"url": url, "pid": proc.pid, "root": str(hub_root())}
    log(f"hub: {url}")


def _service_pids() -> set[int]:
    """Our host-side services, also those an unclean stop left out of the state file."""
    marker = f"--host {net.HOST_ADDR} ".encode()
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"servefleet_dev.hub serve" in cmdline and marker in cmdline:
                pids.add(int(proc.name))
    return pids


def stop_all(state: TestbedState, timeout: float = 5) -> None:
    pids = _service_pids() | {
        svc["pid"] for svc in state.services.values() if _alive(svc.get("pid"))
    }
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    state.services.clear()
