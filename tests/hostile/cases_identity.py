"""The engine's identity holds no power and no secrets (#27 rule 1).

- servefleet_user (and a depot's depot_user) names an account of servefleet's own: a name that
  an account or group on the node already has and that is not servefleet's is refused before
  anything changes (core.node.account_problem, the one rule; the data check only asks for
  useradd's form). Checked with the real Account fact on this machine's accounts and groups,
  which must be unchanged afterwards.
- The engine's unit hides root's etc/ (the hub token, the depot key) and state/ wherever
  servefleet_root is (InaccessiblePaths=, core/sandbox.py), for both engines.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from servefleet.core.node import account_problem, parse_account
from servefleet.core.systemd import render_unit
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet.engines.vllm import logic as vllm
from servefleet.facts import batch
from servefleet.facts.node import Account
from servefleet_dev.testbed.material import load
from tests.hostile.table import harmless, refused

CATEGORY = "service identity"
REPO = Path(__file__).resolve().parents[2]
HOME, SHELL = "/opt/servefleet/cache", "/usr/sbin/nologin"
ACCOUNT_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow")


def accounts_digest() -> str:
    h = hashlib.sha256()
    for path in ACCOUNT_FILES:
        if os.path.exists(path):
            h.update(Path(path).read_bytes())
    return h.hexdigest()


def taken(name: str, key: str = "servefleet_user"):
    """account_problem for `name` as this machine's real Account fact reads it."""

    def attempt():
        before = accounts_digest()
        out = subprocess.run(
            ["sh", "-c", batch.command_of(Account, {"user": name, "group": name})],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = parse_account(out.splitlines())
        assert found["user"] or found["group"], f"this machine has no {name}: not a case here"
        problem = account_problem(key, name, found, HOME, SHELL)
        assert accounts_digest() == before, "an account or group changed"
        assert problem is None or "\n" not in problem
        return problem

    return attempt


def hidden(render, root: str):
    def check():
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            text = render(root)
        finally:
            os.chdir(cwd)
        lines = [ln for ln in text.splitlines() if ln.startswith("InaccessiblePaths=")]
        assert lines == [f"InaccessiblePaths=-{root}/etc -{root}/state"], lines

    return check


def vllm_unit(root: str) -> str:
    data = {**load("all", "spark", "vllm"), "servefleet_root": root}
    return render_unit(
        "files/vllm/servefleet-vllm.service.j2",
        vllm.unit_context(data, f"{root}/models/o--m/" + "a" * 40),
    )


def llama_unit(root: str) -> str:
    data = {**load("all", "rtx4090", "llamacpp"), "servefleet_root": root}
    return render_unit(
        "files/llamacpp/servefleet-llama.service.j2",
        llamacpp.unit_context(data, f"{root}/models/o--m/" + "a" * 40, lambda: None),
    )


CASES = (
    [
        refused(
            CATEGORY,
            f"servefleet_user: the existing account {name}",
            f"an account {name!r}",
            taken(name),
        )
        for name in ("root", "daemon", "bin", "nobody", "www-data", "postgres", "messagebus")
    ]
    + [
        refused(
            CATEGORY,
            f"servefleet_user: the existing group {name}",
            f"a group {name!r}",
            taken(name),
        )
        for name in (
            "adm",
            "sudo",
            "video",
            "staff",
            "systemd-journal",
            "ssl-cert",
            "disk",
            "shadow",
        )
    ]
    + [
        refused(
            CATEGORY,
            "depot_user: the existing account backup",
            "key 'depot_user' = 'backup'",
            taken("backup", "depot_user"),
        ),
    ]
    + [
        harmless(
            CATEGORY,
            f"{engine}: servefleet_root {root}",
            "the unit hides its etc/ and state/",
            hidden(render, root),
        )
        for engine, render in (("vLLM", vllm_unit), ("llama.cpp", llama_unit))
        for root in ("/srv/servefleet-b", "/var/lib/servefleet")
    ]
)
