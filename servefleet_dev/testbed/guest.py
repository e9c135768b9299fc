"""What a testbed guest reports about itself, for the tests and the test material: its Python
differs by release (Debian 12: 3.11, Debian 13: 3.13), so nothing names it, it is asked."""

import functools
import subprocess

from servefleet_dev.testbed import hosts
from servefleet_dev.testbed.state import HostRecord

PY_VERSION = "import sys; print('%d.%d' % sys.version_info[:2])"


@functools.cache
def _python_version(address: str, port: int, machine_id: str) -> str:
    rec = HostRecord(name="", role="", address=address, ssh_port=port)
    out = subprocess.run(
        [*hosts.ssh_args(rec), "python3", "-c", f'"{PY_VERSION}"'],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


def machine_id(rec: HostRecord) -> str:
    """The guest's /etc/machine-id (made when it was seeded): a re-created host is another."""
    path = hosts.hosts_dir() / rec.name / "upper/etc/machine-id"
    return path.read_text().strip() if path.exists() else ""


def python_version(rec: HostRecord) -> str:
    """The guest's /usr/bin/python3 as `major.minor`, as the guest reports it."""
    return _python_version(rec.address, rec.ssh_port, machine_id(rec))


def site_packages(rec: HostRecord, venv: str) -> str:
    """A venv's site-packages on the guest, made with the guest's own Python."""
    return f"{venv}/lib/python{python_version(rec)}/site-packages"
