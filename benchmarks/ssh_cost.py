"""What the SSH connection itself costs per host, with paramiko as pyinfra uses it.

Run: .venv/bin/python benchmarks/ssh_cost.py [--hosts 10] [--runs 10]

Uses its own testbed instance (SERVEFLEET_TESTBED_INSTANCE=9 unless set): --hosts hosts up,
reached as a fleet is (the admin user, the testbed key, host keys checked against the pinned
known_hosts: an unknown or changed key fails the connection). Printed:
  - one connection (TCP, key exchange, host key check, public-key auth), median of --runs, for
    paramiko's defaults and for each key exchange, cipher and compression setting tried, with
    what the server and paramiko agreed on;
  - one command on an open connection (`sudo -n true`, what each fact read costs), median;
  - connecting to all --hosts side by side (gevent, as pyinfra connects), wall time.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from gevent import monkey  # noqa: E402

monkey.patch_all()  # as pyinfra_cli does: parallel connections need patched sockets

import gevent  # noqa: E402
import paramiko  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from servefleet_dev.testbed import (  # noqa: E402
    hosts as tb_hosts,
    lifecycle,
)
from servefleet_dev.testbed.image import ADMIN_USER  # noqa: E402
from servefleet_dev.testbed.state import known_hosts_path, load_state  # noqa: E402

# name -> paramiko connect() keyword arguments. Every variant keeps host-key checking on.
VARIANTS = {
    "paramiko defaults": {},
    "compression on": {"compress": True},
    "kex curve25519-sha256": {
        "disabled_algorithms": {
            "kex": [
                "ecdh-sha2-nistp256",
                "ecdh-sha2-nistp384",
                "ecdh-sha2-nistp521",
                "diffie-hellman-group16-sha512",
                "diffie-hellman-group-exchange-sha256",
                "diffie-hellman-group14-sha256",
                "diffie-hellman-group-exchange-sha1",
                "diffie-hellman-group14-sha1",
                "diffie-hellman-group1-sha1",
            ]
        }
    },
    "kex ecdh-sha2-nistp256": {
        "disabled_algorithms": {"kex": ["curve25519-sha256@libssh.org", "curve25519-sha256"]}
    },
    "kex diffie-hellman-group14-sha256": {
        "disabled_algorithms": {
            "kex": [
                "curve25519-sha256@libssh.org",
                "curve25519-sha256",
                "ecdh-sha2-nistp256",
                "ecdh-sha2-nistp384",
                "ecdh-sha2-nistp521",
                "diffie-hellman-group16-sha512",
                "diffie-hellman-group-exchange-sha256",
            ]
        }
    },
    "cipher aes256-ctr": {
        "disabled_algorithms": {
            "ciphers": [
                "aes128-ctr",
                "aes192-ctr",
                "aes128-gcm@openssh.com",
                "aes256-gcm@openssh.com",
                "chacha20-poly1305@openssh.com",
                "aes128-cbc",
                "aes192-cbc",
                "aes256-cbc",
                "3des-cbc",
            ]
        }
    },
}


class _LastKex(logging.Handler):
    """paramiko names the agreed key exchange only in its debug log ("Kex: NAME")."""

    last = "?"

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Kex: "):
            _LastKex.last = message[5:]


_log = logging.getLogger("paramiko.transport")
_log.setLevel(logging.DEBUG)
_log.propagate = False
_log.addHandler(_LastKex())


def connect(rec, key: paramiko.PKey, **kwargs) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts_path()))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())  # checked, never trusted blind
    client.connect(
        rec.address,
        port=rec.ssh_port,
        username=ADMIN_USER,
        pkey=key,
        allow_agent=False,
        look_for_keys=False,
        timeout=10,
        **kwargs,
    )
    return client


def agreed(client: paramiko.SSHClient) -> str:
    t = client.get_transport()
    return f"{_LastKex.last}, {t.local_cipher}, {t.local_mac}"


def timed(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    quiet = lambda m: None  # noqa: E731
    lifecycle.down(log=quiet)
    lifecycle.up(lifecycle.mixed_names(args.hosts), log=quiet)
    try:
        recs = list(load_state().hosts.values())
        key = paramiko.PKey.from_path(str(tb_hosts.ssh_key()))
        first = recs[0]
        table = Table(title=f"one SSH connection to a testbed host (median of {args.runs})")
        for col in ("setting", "connect ms", "agreed (kex, cipher, mac)"):
            table.add_column(col)
        for name, kwargs in VARIANTS.items():
            seen = []

            def once(kwargs=kwargs, seen=seen):
                client = connect(first, key, **kwargs)
                seen.append(agreed(client))
                client.close()

            table.add_row(name, f"{timed(once, args.runs) * 1000:.1f}", seen[-1])
        Console().print(table)

        client = connect(first, key)

        def command():
            _, out, _ = client.exec_command("sudo -n true")
            out.channel.recv_exit_status()

        print(
            f"one command on an open connection (sudo -n true): "
            f"{timed(command, args.runs) * 1000:.1f} ms median"
        )
        client.close()

        def all_side_by_side():
            clients = gevent.joinall(
                [gevent.spawn(connect, r, key) for r in recs], raise_error=True
            )
            for g in clients:
                g.value.close()

        wall = timed(all_side_by_side, max(3, args.runs // 3))
        print(
            f"connecting to {len(recs)} hosts side by side: {wall:.2f} s wall "
            f"({wall / len(recs) * 1000:.0f} ms per host)"
        )
    finally:
        lifecycle.down(log=quiet)


if __name__ == "__main__":
    main()
