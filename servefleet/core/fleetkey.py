"""The fleet key (operator side): what nodes log in to the depot's read-only account with.

`depot_ssh_key` names a private key file, or one is generated once into the servefleet cache
(~/.cache/servefleet/fleet/depot_ed25519). Operators sharing a fleet share that file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from servefleet.core.errors import DataError
from servefleet.core.paths import cache_subdir


def fleet_key_path(data, host_name: str) -> Path:
    """The fleet key's private half on the operator's machine; generated on first use."""
    if data.get("depot_ssh_key"):
        path = Path(data["depot_ssh_key"]).expanduser()
        if not path.is_file():
            raise DataError(f"invalid data for host {host_name}: depot_ssh_key = {str(path)!r} "
                            f"is not a file; nothing was changed")
        return path
    path = cache_subdir("fleet") / "depot_ed25519"
    if not path.exists():
        _generate(path)
    return path


def _generate(path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(tmp, 0o600)
    try:
        os.link(tmp, path)  # atomic, and never replaces a key another run made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def fleet_key(data, host_name: str) -> tuple[str, str]:
    """(private key text, public key line) of the fleet key."""
    private = fleet_key_path(data, host_name).read_text()
    key = serialization.load_ssh_private_key(private.encode(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} servefleet-fleet"


def depot_models(data) -> list[dict]:
    """depot_models with the defaults filled in (revision main, include everything)."""
    return [{"repo_id": m["repo_id"], "revision": m.get("revision") or "main",
             "include": list(m.get("include") or ["*"])} for m in data.get("depot_models") or []]
