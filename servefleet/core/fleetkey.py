"""The fleet key (operator side): what nodes log in to the depot's read-only account with.

`depot_ssh_key` names a private key file, or one is generated once into the servefleet cache
(~/.cache/servefleet/fleet/depot_ed25519). Operators sharing a fleet share that file.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from servefleet.core.errors import DataError
from servefleet.core.operator_files import MAX_KEY_BYTES, FileRefused, read_regular
from servefleet.core.paths import cache_subdir

# Exactly one OpenSSH private key, as ssh-keygen writes it: the file is uploaded to the nodes as
# it is, so a second key or notes beside it would travel too.
ONE_KEY = re.compile(
    r"-----BEGIN OPENSSH PRIVATE KEY-----\n(?:[A-Za-z0-9+/=]{1,76}\n){1,200}"
    r"-----END OPENSSH PRIVATE KEY-----\n?"
)


class FleetKeyError(ValueError):
    """The fleet key file is not a usable private key; one line, never the key's bytes."""


def load_key(path: Path) -> tuple[str, str]:
    """(private key text, public key line) of an OpenSSH private key (ed25519, ECDSA, or RSA of
    at least 2048 bits) without a passphrase (nodes use it unattended); FleetKeyError naming the
    file and the problem."""
    try:
        raw = read_regular(path, MAX_KEY_BYTES, key="private")
    except FileNotFoundError:
        raise FleetKeyError(f"{path} does not exist") from None
    except OSError as exc:
        raise FleetKeyError(f"{path} cannot be read ({exc.strerror})") from None
    except FileRefused as exc:
        raise FleetKeyError(str(exc)) from None
    try:
        private = raw.decode("ascii")
        key = serialization.load_ssh_private_key(raw, password=None)
    except UnicodeDecodeError:
        raise FleetKeyError(f"{path} holds non-ASCII bytes: not an OpenSSH private key") from None
    except TypeError:  # cryptography: "Password was not given but private key is encrypted"
        raise FleetKeyError(
            f"{path} is protected by a passphrase: nodes use it unattended; "
            f"expected a key without one"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise FleetKeyError(
            f"{path} is not an OpenSSH private key (expected a key file as "
            f"ssh-keygen -t ed25519 writes it)"
        ) from None
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < 2048:
        raise FleetKeyError(
            f"{path} is an RSA key of {key.key_size} bits: expected ed25519, "
            f"ECDSA or RSA of at least 2048 bits"
        )
    if not isinstance(
        key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)
    ):
        raise FleetKeyError(
            f"{path} is a {type(key).__name__} key: expected ed25519, ECDSA "
            f"or RSA of at least 2048 bits"
        )
    if any(ch != "\n" and not " " <= ch <= "~" for ch in private):
        raise FleetKeyError(f"{path} holds control characters besides its line ends (CRLF?)")
    if not ONE_KEY.fullmatch(private):
        raise FleetKeyError(
            f"{path} holds more than one private key, or text besides it (notes, a public "
            f"key): it is uploaded to the nodes as it is; expected exactly one key as "
            f"ssh-keygen writes it"
        )
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, f"{public} servefleet-fleet"


def depot_key_problem(data) -> str | None:
    """Why depot_ssh_key is unusable, for validation (before anything changes); None if fine."""
    if not data.get("depot_ssh_key"):
        return None
    try:
        load_key(Path(data["depot_ssh_key"]).expanduser())
    except FleetKeyError as exc:
        return str(exc)
    return None


def fleet_key_path(data, host_name: str) -> Path:
    """The fleet key's private half on the operator's machine; generated on first use."""
    if data.get("depot_ssh_key"):
        return Path(data["depot_ssh_key"]).expanduser()
    path = cache_subdir("fleet") / "depot_ed25519"
    if not path.exists():
        _generate(path)
    return path


def _generate(path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
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
    """(private key text, public key line) of the fleet key; DataError when it is unusable."""
    try:
        return load_key(fleet_key_path(data, host_name))
    except FleetKeyError as exc:
        raise DataError(
            f"invalid data for host {host_name}: key 'depot_ssh_key': {exc}; nothing was changed"
        ) from None


def depot_models(data) -> list[dict]:
    """depot_models with the defaults filled in (revision main, include everything)."""
    return [
        {
            "repo_id": m["repo_id"],
            "revision": m.get("revision") or "main",
            "include": list(m.get("include") or ["*"]),
        }
        for m in data.get("depot_models") or []
    ]
