"""`servefleet demo`: the whole story on the local testbed, in one go (README's first command)."""


from rich.console import Console

from servefleet.commands.testbed import print_status
from servefleet.converge import pyinfra
from servefleet.testbed import lifecycle

INVENTORY = "inventory/testbed.py"


def register(sub) -> None:
    p = sub.add_parser("demo", help="bring the testbed up and converge the recipes on it")
    p.add_argument("--hosts", default=",".join(lifecycle.DEFAULT_HOSTS))
    p.set_defaults(func=run)


def _step(console: Console, title: str, deploy: str, limit: str | None = None) -> bool:
    console.rule(title)
    result = pyinfra(INVENTORY, deploy, limit=limit)
    ok = result.returncode == 0
    console.print(f"{deploy}: {result.operations} operations, {result.changed} changed, "
                  f"{result.errors} errors -> {'[green]ok' if ok else '[red]FAILED'}")
    if not ok:
        console.print(result.output[-4000:])
    return ok


def run(args) -> int:
    console = Console()
    console.rule("Testbed up")
    lifecycle.up([h for h in args.hosts.split(",") if h], log=lambda m: console.print(m))
    ok = _step(console, "Base deploy on every host", "deploys/base.py")
    ok = ok and _step(console, "Base deploy again: nothing to change", "deploys/base.py")
    console.rule("Hosts")
    print_status(lifecycle.status(), console)
    console.print("The testbed stays up: `servefleet testbed ssh NAME`, "
                  "`pyinfra inventory/testbed.py DEPLOY`, `servefleet testbed down`.")
    return 0 if ok else 1
