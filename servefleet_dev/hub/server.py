"""Listening sockets and the process around them: `make_server`, `running_hub`, `serve`.

The hub binds loopback or the testbed's own bridge address, never a wildcard (its /_servefleet/
endpoints take no token), and never takes over a port someone already listens on.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

from servefleet_dev.hub.handler import HubRequestHandler
from servefleet_dev.hub.state import HubState
from servefleet_dev.hub.store import HubStore, atomic_write


class HubHTTPServer(ThreadingHTTPServer):
    """One listening socket; several can share one HubState (e.g. bridge address + loopback)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a fleet's worth of clients connecting at once; the default is 5

    def __init__(self, hub: HubState, host: str, port: int):
        self.hub = hub
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), HubRequestHandler)

    def server_bind(self):
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn), which stalls without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[0], self.server_address[1]

    @property
    def url(self) -> str:
        return format_url(self.server_address[0], self.server_address[1])

    def process_request(self, request, client_address):
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        """A client that resets or stalls mid-request is no server error: no traceback for it."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def server_close(self):
        """Stop listening and wake the threads idling on keep-alive connections."""
        super().server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class AddressError(OSError):
    """The address is a wildcard, not on this machine, or its port is taken."""


def format_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_address(host: str, port: int) -> None:
    """Refuse what is not one unicast IP address, wildcards in any spelling, bad ports, and ports
    someone already listens on (never take them over)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise AddressError(errno.EINVAL, f"port {port!r}: expected 0-65535 (0: a free one)")
    try:
        # Stricter than bind(), which takes "0", "127.1" or "0x0" too: only the canonical forms.
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(
            errno.EINVAL, f"{host!r}: give an IP address (loopback or bridge)"
        ) from None
    # A dual-stack socket bound to ::ffff:0.0.0.0 listens on every IPv4 address: judge what it maps.
    plain = getattr(addr, "ipv4_mapped", None) or addr
    if plain.is_unspecified:
        raise AddressError(
            errno.EINVAL, f"refusing wildcard address {host!r}: bind loopback or the bridge"
        )
    # Linux lets a TCP socket bind multicast and broadcast addresses (255.255.255.255: reserved).
    if plain.is_multicast or (plain.version == 4 and plain.is_reserved):
        raise AddressError(
            errno.EINVAL, f"refusing {host!r}: not a unicast address of this machine"
        )
    if port:
        family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(1)
            if probe.connect_ex((host, port)) == 0:
                raise AddressError(errno.EADDRINUSE, f"{format_url(host, port)} is already in use")


def make_server(hub: HubState, host: str, port: int) -> HubHTTPServer:
    """Bind (after check_address) without serving yet; raises AddressError with a clear message."""
    check_address(host, port)
    try:
        return HubHTTPServer(hub, host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AddressError(exc.errno, f"{format_url(host, port)} is already in use") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise AddressError(exc.errno, f"{host} is not an address of this machine") from None
        raise


@contextlib.contextmanager
def running_hub(
    root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, token: str | None = None
) -> Iterator[str]:
    """Serve root in a background thread for the duration of the block; yields the base URL.

    Use the URL as HF_ENDPOINT (or the client's endpoint=); hub_stats()/set_fault() talk to it.
    """
    server = make_server(HubState(HubStore(root), token=token), host, port)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
    )
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def serve(
    root: str | os.PathLike,
    hosts: list[str] | tuple[str, ...] = ("127.0.0.1",),
    port: int = 0,
    *,
    token: str | None = None,
    pidfile: str | os.PathLike | None = None,
    ready_file: str | os.PathLike | None = None,
    verbose: bool = False,
) -> int:
    """Serve root on each host (same port) until SIGTERM/SIGINT; for `hub serve` and supervisors.

    Prints one "listening on URL" line per address once all are bound, then writes ready_file (the
    URLs, one a line) so a supervisor can wait for it. With port 0 the first address picks the port.
    """
    hub = HubState(HubStore(root), token=token, verbose=verbose)
    servers: list[HubHTTPServer] = []
    try:
        for host in hosts:
            servers.append(
                make_server(hub, host, port or (servers[0].server_address[1] if servers else 0))
            )
    except AddressError as exc:
        for server in servers:
            server.server_close()
        print(f"servefleet hub: {exc.strerror}", file=sys.stderr)
        return 1

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    if pidfile:
        atomic_write(Path(pidfile), f"{os.getpid()}\n".encode())
    for server in servers:
        print(f"servefleet hub: serving {root} on {server.url}", flush=True)
    if ready_file:
        atomic_write(Path(ready_file), "".join(f"{s.url}\n" for s in servers).encode())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        for path in (pidfile, ready_file):
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    return 0
