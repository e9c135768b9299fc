"""Hostile key files: the API key and the hub token are read on the operator's side, checked
the same way for both engines, and refused naming the file and the problem (never the key)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from servefleet.core import fleetkey
from servefleet.core.errors import DataError
from servefleet.core.models import operator_token
from servefleet.fleet.data import HostData, Layer, validate
from servefleet_dev.testbed.material import load
from tests.hostile.table import harmless, refused

CATEGORY = "key files"
SPARK = load("all", "spark")
RTX = load("all", "rtx4090")


def with_file(content: bytes | None, kind: str = "file"):
    """A temp key file holding content (None: no file; kind "dir": a directory)."""
    tmp = Path(tempfile.mkdtemp(prefix="servefleet-key-"))
    path = tmp / "api-key"
    if kind == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


def attempt(
    content: bytes | None,
    kind: str = "file",
    key: str = "api_key_file",
    base: dict = SPARK,
    groups=("spark",),
    recipe="serve_bf16",
):
    def run():
        path = with_file(content, kind)
        data = {key: str(path), "service_host": "0.0.0.0"}
        try:
            validate(
                HostData(
                    "node-01", list(groups), [Layer("--data", data), Layer("group_data", base)]
                ),
                recipe,
            )
        except DataError as exc:
            message = str(exc)
            if content and len(content) > 7:
                assert content.decode(errors="replace").split("\n")[0] not in message, (
                    "the key is in the message"
                )
            return message
        return None

    return run


def case(name, content, expected, **kw):
    return refused(CATEGORY, name, expected, attempt(content, **kw))


def accepted_as(content: bytes, key: str):
    def check():
        assert attempt(content)() is None
        assert attempt(content, base=RTX, groups=("rtx4090",), recipe="serve_q4_llamacpp")() is None

    return check


def token_env(value: str):
    def run():
        saved = os.environ.get("HF_TOKEN")
        os.environ["HF_TOKEN"] = value
        try:
            operator_token({}, "node-01")
        except DataError as exc:
            return str(exc)
        finally:
            if saved is None:
                os.environ.pop("HF_TOKEN", None)
            else:
                os.environ["HF_TOKEN"] = saved
        return None

    return run


def _key(private, encryption=None) -> bytes:
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        encryption or serialization.NoEncryption(),
    )


def depot_key(name, content: bytes, expected: str):
    """depot_ssh_key refused when the data is validated (before anything changes), not when the
    depot or a model copy first reads it."""
    return case(f"depot_ssh_key: {name}", content, expected, key="depot_ssh_key")


def fleet_key_at_deploy_time():
    """fleet_key() (what the depot and copy steps call) refuses the same file with one
    DataError line, never a traceback from the key parser."""
    path = with_file(
        b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    try:
        fleetkey.fleet_key({"depot_ssh_key": str(path)}, "node-01")
    except DataError as exc:
        assert "is not an OpenSSH private key" in str(exc) and "\n" not in str(exc), str(exc)
    else:
        raise AssertionError("a malformed fleet key was accepted")


def good_fleet_keys_pass():
    for private in (ed25519.Ed25519PrivateKey.generate(), ec.generate_private_key(ec.SECP256R1())):
        assert attempt(_key(private), key="depot_ssh_key", recipe=None)() is None


ED25519 = _key(ed25519.Ed25519PrivateKey.generate())
LLAMA = {"base": RTX, "groups": ("rtx4090",), "recipe": "serve_q4_llamacpp"}
CASES = [
    case("an empty key file", b"", "is empty"),
    case("an empty key file (llama.cpp)", b"", "is empty", **LLAMA),
    case(
        "a second line that would become LD_PRELOAD",
        b"sk-abcdefgh\nLD_PRELOAD=/tmp/x.so\n",
        "holds more than one line",
    ),
    case(
        "a second line (llama.cpp)",
        b"sk-abcdefgh\nExecStartPre=/bin/sh\n",
        "holds more than one line",
        **LLAMA,
    ),
    case("a missing file", None, "does not exist"),
    case("a directory", None, "cannot be read", kind="dir"),
    case("non-ASCII bytes", "sk-clé-secrète".encode(), "non-ASCII"),
    case("a space inside", b"sk-abc defgh\n", "characters outside the allowed set"),
    case("a quote inside", b'sk-abc"defgh\n', "characters outside the allowed set"),
    case("a dollar inside", b"sk-abc$HOMEdef\n", "characters outside the allowed set"),
    case("a backslash inside", b"sk-abc\\ndefgh\n", "characters outside the allowed set"),
    case("too short", b"abc\n", "too short/long"),
    case("too long", b"k" * 5000 + b"\n", "too short/long"),
    case("a NUL byte", b"sk-abc\x00defgh\n", "characters outside the allowed set"),
    case("a CR in the middle", b"sk-abc\rdefgh\n", "more than one line"),
    case("an unreadable hub token file", None, "does not exist", key="hf_token_file"),
    case(
        "a hub token with two lines", b"hf_abcdefgh\nx\n", "more than one line", key="hf_token_file"
    ),
    refused(
        CATEGORY,
        "$HF_TOKEN with a newline",
        "invalid $HF_TOKEN",
        token_env("hf_abcdefgh\nInjected: 1"),
    ),
    depot_key("not a key at all", b"hello\n", "is not an OpenSSH private key"),
    depot_key("a truncated key", ED25519[:120], "is not an OpenSSH private key"),
    depot_key(
        "the public half",
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + b"\n",
        "is not an OpenSSH private key",
    ),
    depot_key(
        "protected by a passphrase",
        _key(ed25519.Ed25519PrivateKey.generate(), serialization.BestAvailableEncryption(b"pw")),
        "is protected by a passphrase",
    ),
    depot_key(
        "an RSA key of 1024 bits",
        _key(rsa.generate_private_key(65537, 1024)),
        "is an RSA key of 1024 bits",
    ),
    depot_key("CRLF line ends", ED25519.replace(b"\n", b"\r\n"), "holds control characters"),
    depot_key("non-ASCII bytes", "clé".encode() * 10, "holds non-ASCII bytes"),
    case("depot_ssh_key: a missing file", None, "does not exist", key="depot_ssh_key"),
    harmless(
        CATEGORY,
        "depot_ssh_key: a malformed key at deploy time",
        "fleet_key() raises one DataError line",
        fleet_key_at_deploy_time,
    ),
    harmless(CATEGORY, "depot_ssh_key: ed25519 and ECDSA keys", "accepted", good_fleet_keys_pass),
    harmless(
        CATEGORY,
        "a key with a CRLF ending",
        "accepted for both engines, without the CR",
        accepted_as(b"sk-abcdefgh\r\n", "api_key_file"),
    ),
    harmless(
        CATEGORY,
        "a key without a trailing newline",
        "accepted for both engines",
        accepted_as(b"sk-abcdefgh", "api_key_file"),
    ),
]
