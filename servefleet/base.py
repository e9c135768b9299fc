"""The base of every node (deploys/base.py): steps shared by all recipes.

Each step reads its values from host.data; the schema has checked them before any step runs.
"""

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, pip, server

from servefleet import facts, schema
from servefleet.operations import node
from servefleet.python_env import install_args


def data() -> dict:
    return host.data.dict()


def family() -> str:
    return host.get_fact(facts.OsRelease)["family"]


def tools_venv() -> str:
    """The small venv of servefleet's own node-side tools (uv, the hf client, gguf)."""
    return f"{host.data.servefleet_root}/tools/venv"


def for_role(role: str, deploy: str) -> bool:
    """True on hosts of `role`; elsewhere a visible no-op ("acts on spark hosts only") and False.

    Lets `pyinfra inventory/fleet.py deploys/serve_bf16.py` run over a mixed fleet safely.
    """
    if role in host.groups:
        return True
    node.skip(name=f"{deploy} acts on {role} hosts only: nothing to do on {host.name}",
              reason=f"{host.name} is not a {role} host")
    return False


def validate_data(extra: dict | None = None) -> None:
    """Stop the whole run before any change if this host's data is missing or malformed."""
    schema.validate(host, {**schema.BASE, **(extra or {})})


def _per_family(key: str):
    table = host.data.get(key)
    fam = family()
    if fam not in table:
        raise schema.DataError(
            f"invalid data for host {host.name}: key {key!r} has no entry for this host's OS "
            f"family {fam!r}; expected one of {sorted(table)} or add {fam!r}")
    return table[fam]


@deploy("Preflight")
def preflight():
    node.preflight(name="Check CPU, GPU/driver and free disk", data=data())


@deploy("OS packages")
def os_packages():
    node.os_packages(name="Install OS packages", packages=_per_family("os_packages"))


@deploy("Service user and directory tree")
def service_user_and_tree():
    root, user = host.data.servefleet_root, host.data.servefleet_user
    server.group(name=f"Group {user}", group=user, system=True)
    server.user(name=f"System user {user}", user=user, group=user, system=True, home=root,
                shell="/usr/sbin/nologin", create_home=False)
    # state/ holds servefleet's records on the node (verified models, builds); others are obvious.
    for sub in ("", "/tools", "/venvs", "/models", "/state", "/etc", "/bin"):
        files.directory(name=f"Directory {root}{sub}", path=f"{root}{sub}", user=user,
                        group=user, mode="755")


@deploy("Tools venv with uv")
def tools():
    venv = tools_venv()
    pip.venv(name="Tools venv", path=venv, python=_per_family("python_interpreter"))
    pip.packages(name=f"uv {host.data.uv_version}", packages=[f"uv=={host.data.uv_version}"],
                 virtualenv=venv, extra_install_args=install_args(host.data) or None)
