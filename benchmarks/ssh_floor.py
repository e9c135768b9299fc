"""The floor of a check: one SSH login plus `sudo -n true` on every testbed host, side by side,
with the fleet's key, user and pinned known_hosts (host keys checked: an unknown one fails).

Run: .venv/bin/python benchmarks/ssh_floor.py paramiko|openssh   (exit 0: every host answered)

  paramiko: in this process, under gevent, as pyinfra connects: a pool of 20 per core (pyinfra's
            default parallelism), every connection kept open until all are done;
  openssh:  one `ssh` process per host, all started at once.
benchmarks/operator_cost.py runs it as a command and measures it beside the real checks.
Uses the testbed instance of $SERVEFLEET_TESTBED_INSTANCE (9 unless set), which must be up.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("SERVEFLEET_TESTBED_INSTANCE", "9")

from gevent import monkey  # noqa: E402

monkey.patch_all()  # as pyinfra_cli does: parallel connections need patched sockets

import gevent.pool  # noqa: E402
import paramiko  # noqa: E402

from servefleet_dev.testbed import hosts as tb_hosts  # noqa: E402
from servefleet_dev.testbed.image import ADMIN_USER  # noqa: E402
from servefleet_dev.testbed.state import known_hosts_path, load_state  # noqa: E402


def with_paramiko(recs: list) -> list[str]:
    key = paramiko.PKey.from_path(str(tb_hosts.ssh_key()))
    clients: list[paramiko.SSHClient] = []

    def login(rec) -> str | None:
        client = paramiko.SSHClient()
        clients.append(client)
        client.load_host_keys(str(known_hosts_path()))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            rec.address,
            port=rec.ssh_port,
            username=ADMIN_USER,
            pkey=key,
            allow_agent=False,
            look_for_keys=False,
            timeout=30,
        )
        _, out, _ = client.exec_command("sudo -n true")
        rc = out.channel.recv_exit_status()
        return None if rc == 0 else f"{rec.name}: sudo -n true exited {rc}"

    pool = gevent.pool.Pool(min(20 * (os.cpu_count() or 1), len(recs)))
    try:
        return [e for e in pool.map(login, recs) if e]
    finally:
        for client in clients:
            client.close()


def with_openssh(recs: list) -> list[str]:
    procs = {
        rec.name: subprocess.Popen(
            [*tb_hosts.ssh_args(rec, ADMIN_USER), "sudo", "-n", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rec in recs
    }
    return [f"{name}: ssh exited {rc}" for name, p in procs.items() if (rc := p.wait()) != 0]


def main() -> int:
    recs = list(load_state().hosts.values())
    if not recs:
        print("the testbed has no hosts", file=sys.stderr)
        return 2
    errors = {"paramiko": with_paramiko, "openssh": with_openssh}[sys.argv[1]](recs)
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
