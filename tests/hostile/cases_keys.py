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
SPARK = load("all", "spark", "vllm")
RTX = load("all", "rtx4090", "llamacpp")


def with_file(content: bytes | None, kind: str = "file"):
    """A temp key file holding content (None: no file; kind "dir": a directory)."""
    tmp = Path(tempfile.mkdtemp(prefix="servefleet-key-"))
    path = tmp / "api-key"
    if kind == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
        path.chmod(0o600)  # as ssh-keygen writes a key: only its owner reads it
    return path


def attempt(
    content: bytes | None,
    kind: str = "file",
    key: str = "api_key_file",
    base: dict = SPARK,
    groups=("spark", "vllm"),
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


# --- #27: key files only the operator (or root) controls; the fleet key is one key -------------


def owned_case(
    name: str,
    content: bytes,
    expected: str,
    key: str = "api_key_file",
    mode: int = 0o600,
    uid: int | None = None,
    link: bool = False,
):
    """A key file of `mode` (owned by `uid`, reached through a symlink when `link`), named by
    `key` in --data: refused naming the file and the problem, the file unchanged (bytes, mode,
    owner), the key never in the message."""

    def run():
        tmp = Path(tempfile.mkdtemp(prefix="servefleet-key-"))
        path = tmp / "key"
        path.write_bytes(content)
        os.chmod(path, mode)
        if uid is not None:
            os.chown(path, uid, -1)
        named = tmp / "link" if link else path
        if link:
            named.symlink_to(path)
        st = path.stat()
        before = (content, st.st_mode, st.st_uid)
        data = {key: str(named), "service_host": "0.0.0.0"}
        if key != "api_key_file":
            data["api_key_file"] = str(with_file(b"sk-abcdefgh\n"))
        try:
            validate(
                HostData("node-01", ["spark"], [Layer("--data", data), Layer("group_data", SPARK)]),
                "serve_bf16",
            )
            message = None
        except DataError as exc:
            message = str(exc)
        st = path.stat()
        assert (path.read_bytes(), st.st_mode, st.st_uid) == before, "the key file changed"
        assert message is None or content.decode(errors="replace")[10:40] not in message
        return message

    return refused(CATEGORY, name, expected, run)


SECOND = _key(ed25519.Ed25519PrivateKey.generate())
PUBLIC = (
    ed25519.Ed25519PrivateKey.generate()
    .public_key()
    .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    + b" ops@laptop\n"
)

CASES += [
    owned_case(
        "an API key file its group may write",
        b"sk-abcdefgh\n",
        "writable by its group or others (mode 0664)",
        mode=0o664,
    ),
    owned_case(
        "a hub token file anyone may write",
        b"hf_abcdefgh\n",
        "writable by its group or others (mode 0606)",
        key="hf_token_file",
        mode=0o606,
    ),
    owned_case(
        "an API key file of another user",
        b"sk-abcdefgh\n",
        "is owned by uid 4242, not by you",
        uid=4242,
    ),
    owned_case(
        "a link to a hub token of another user",
        b"hf_abcdefgh\n",
        "is owned by uid 4243",
        key="hf_token_file",
        uid=4243,
        link=True,
    ),
    owned_case(
        "depot_ssh_key readable by all (0644)",
        ED25519,
        "readable by its group or others (mode 0644)",
        key="depot_ssh_key",
        mode=0o644,
    ),
    owned_case(
        "depot_ssh_key readable by its group (0640)",
        ED25519,
        "readable by its group or others (mode 0640)",
        key="depot_ssh_key",
        mode=0o640,
    ),
    owned_case(
        "depot_ssh_key of another user",
        ED25519,
        "is owned by uid 4244",
        key="depot_ssh_key",
        uid=4244,
    ),
    owned_case(
        "depot_ssh_key holding two keys",
        ED25519 + SECOND,
        "holds more than one private key, or text besides it",
        key="depot_ssh_key",
    ),
    owned_case(
        "depot_ssh_key with notes after the key",
        ED25519 + b"passphrase: hunter2\n",
        "holds more than one private key, or text besides it",
        key="depot_ssh_key",
    ),
    owned_case(
        "depot_ssh_key with a public key before it",
        PUBLIC + ED25519,
        "holds more than one private key, or text besides it",
        key="depot_ssh_key",
    ),
    owned_case(
        "ssh_key readable by all (0644)",
        ED25519,
        "key 'ssh_key' from --data: ",
        key="ssh_key",
        mode=0o644,
    ),
    owned_case("ssh_key of another user", ED25519, "is owned by uid 4245", key="ssh_key", uid=4245),
    refused(
        CATEGORY,
        "ssh_key naming a missing file",
        "does not exist; expected the SSH private key to log in to node-01 with",
        attempt(None, key="ssh_key"),
    ),
    refused(
        CATEGORY,
        "ssh_key of ~nosuchuser",
        "~user names no user on this machine",
        lambda: attempt_value("ssh_key", "~nosuchuser-servefleet/id_ed25519"),
    ),
]


def attempt_value(key: str, value: str) -> str | None:
    try:
        validate(
            HostData("node-01", ["spark"], [Layer("--data", {key: value}), Layer("g", SPARK)]),
            None,
        )
    except DataError as exc:
        return str(exc)
    return None
